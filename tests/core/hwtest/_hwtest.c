/* Test-only helpers that make allocations the way C code outside the
 * interpreter's control does: through PyMem_RawMalloc with the GIL released,
 * and from threads that have no Python thread state at all. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <time.h>

/* raw_alloc_nogil(count, size) -> list of addresses, allocated with the GIL
 * released.  The caller frees them with raw_free_nogil(). */
static PyObject *
raw_alloc_nogil(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t count, size;
    if (!PyArg_ParseTuple(args, "nn", &count, &size) || count < 0 || size < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "count and size must be >= 0");
        }
        return NULL;
    }
    void **ptrs = malloc(sizeof(void *) * (size_t)(count ? count : 1));
    if (ptrs == NULL) {
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        ptrs[i] = PyMem_RawMalloc((size_t)size);
    }
    Py_END_ALLOW_THREADS
    PyObject *list = PyList_New(count);
    for (Py_ssize_t i = 0; list != NULL && i < count; i++) {
        PyList_SET_ITEM(list, i, PyLong_FromVoidPtr(ptrs[i]));
    }
    free(ptrs);
    return list;
}

static PyObject *
raw_free_nogil(PyObject *self, PyObject *list)
{
    (void)self;
    Py_ssize_t n = PyList_Size(list);
    if (n < 0) {
        return NULL;
    }
    void **ptrs = malloc(sizeof(void *) * (size_t)(n ? n : 1));
    if (ptrs == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ptrs[i] = PyLong_AsVoidPtr(PyList_GET_ITEM(list, i));
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMem_RawFree(ptrs[i]);
    }
    Py_END_ALLOW_THREADS
    free(ptrs);
    Py_RETURN_NONE;
}

/* A churn of malloc/realloc/free over 16 slots, driven by a fixed LCG.  A
 * slot's blocks stay in one domain: RAW without the GIL, else MEM or OBJ by
 * the slot's parity.  With `check`, errno is set to a value no allocator sets
 * (EDOM) before each call and checked after every free, every successful
 * malloc and realloc and, with the GIL, every report of a block of its own
 * (PyTraceMalloc_Track/Untrack). */
typedef struct {
    Py_ssize_t iterations;
    size_t max_size;
    unsigned seed;
    int gil;   /* 1: MEM, OBJ and reported blocks, 0: RAW blocks */
    int check; /* count the calls that change errno */
    long changed;
    int seen; /* the last errno a call left */
} churn_t;

#define ERRNO_SENTINEL EDOM

static void
errno_check(churn_t *churn)
{
    if (churn->check && errno != ERRNO_SENTINEL) {
        churn->changed++;
        churn->seen = errno;
    }
    errno = ERRNO_SENTINEL;
}

static PyMemAllocatorDomain
slot_domain(const churn_t *churn, int slot)
{
    return !churn->gil ? PYMEM_DOMAIN_RAW : (slot & 1) ? PYMEM_DOMAIN_OBJ : PYMEM_DOMAIN_MEM;
}

static void *
block_malloc(PyMemAllocatorDomain domain, size_t size)
{
    return domain == PYMEM_DOMAIN_RAW   ? PyMem_RawMalloc(size)
           : domain == PYMEM_DOMAIN_OBJ ? PyObject_Malloc(size)
                                        : PyMem_Malloc(size);
}

static void *
block_realloc(PyMemAllocatorDomain domain, void *ptr, size_t size)
{
    return domain == PYMEM_DOMAIN_RAW   ? PyMem_RawRealloc(ptr, size)
           : domain == PYMEM_DOMAIN_OBJ ? PyObject_Realloc(ptr, size)
                                        : PyMem_Realloc(ptr, size);
}

static void
block_free(PyMemAllocatorDomain domain, void *ptr)
{
    if (domain == PYMEM_DOMAIN_RAW) {
        PyMem_RawFree(ptr);
    }
    else if (domain == PYMEM_DOMAIN_OBJ) {
        PyObject_Free(ptr);
    }
    else {
        PyMem_Free(ptr);
    }
}

static void *
churn_run(void *arg)
{
    churn_t *churn = arg;
    void *keep[16] = {0};
    unsigned seed = churn->seed;
    errno = ERRNO_SENTINEL;
    for (Py_ssize_t i = 0; i < churn->iterations; i++) {
        seed = seed * 1103515245u + 12345u;
        int slot = (int)((seed >> 16) % 16);
        size_t size = 1 + (seed >> 8) % churn->max_size;
        PyMemAllocatorDomain domain = slot_domain(churn, slot);
        if (keep[slot] == NULL) {
            keep[slot] = block_malloc(domain, size);
            if (keep[slot] != NULL) {
                errno_check(churn);
            }
        }
        else if (seed & 1) {
            void *p = block_realloc(domain, keep[slot], size);
            if (p != NULL) {
                errno_check(churn);
                keep[slot] = p;
            }
        }
        else {
            block_free(domain, keep[slot]);
            errno_check(churn);
            keep[slot] = NULL;
        }
        if (churn->check && churn->gil && (seed & 6) == 0) {
            void *p = malloc(64);
            if (p != NULL) {
                PyTraceMalloc_Track(7, (uintptr_t)p, 64);
                errno_check(churn);
                PyTraceMalloc_Untrack(7, (uintptr_t)p);
                errno_check(churn);
                free(p);
                errno = ERRNO_SENTINEL;
            }
        }
    }
    for (int i = 0; i < 16; i++) {
        block_free(slot_domain(churn, i), keep[i]);
    }
    return NULL;
}

/* churn_nogil(iterations, max_size): RAW malloc/realloc/free with the GIL released. */
static PyObject *
churn_nogil(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t iterations, max_size;
    if (!PyArg_ParseTuple(args, "nn", &iterations, &max_size) || max_size < 1) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "max_size must be >= 1");
        }
        return NULL;
    }
    churn_t churn = {iterations, (size_t)max_size, 12345u, 0, 0, 0, 0};
    Py_BEGIN_ALLOW_THREADS
    churn_run(&churn);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    sem_t done;
    size_t size;
    void *ptr;
} probe_t;

static void *
probe_thread(void *arg)
{
    probe_t *probe = arg;
    /* A thread the interpreter has never seen: no thread state, no GIL. */
    probe->ptr = PyMem_RawMalloc(probe->size);
    sem_post(&probe->done);
    return NULL;
}

/* foreign_thread_alloc_while_holding_gil(size, timeout_ms) -> address or None.
 * Starts a pthread that allocates through PyMem_RawMalloc and waits for it
 * while HOLDING the GIL.  A tracer whose RAW hook takes the GIL cannot let
 * the thread finish: the wait times out and None is returned (the thread is
 * then joined after releasing the GIL, and its block freed). */
static PyObject *
foreign_thread_alloc_while_holding_gil(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t size;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "ni", &size, &timeout_ms)) {
        return NULL;
    }
    probe_t probe;
    probe.size = (size_t)size;
    probe.ptr = NULL;
    sem_init(&probe.done, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, NULL, probe_thread, &probe) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_create failed");
        return NULL;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    int finished;
    do {
        finished = sem_timedwait(&probe.done, &deadline) == 0;
    } while (!finished && errno == EINTR);
    void *ptr = probe.ptr;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(thread, NULL);
    Py_END_ALLOW_THREADS
    sem_destroy(&probe.done);
    if (!finished) {
        PyMem_RawFree(probe.ptr);
        Py_RETURN_NONE;
    }
    return PyLong_FromVoidPtr(ptr);
}

#if PY_VERSION_HEX >= 0x030D0000
/* Another tool's reference tracer (3.13+), counting the objects created,
 * chaining to whatever held the slot before it. */
static PyRefTracer other_prev;
static void *other_prev_data;
static long long other_created;

static int
other_tracer(PyObject *op, PyRefTracerEvent event, void *data)
{
    (void)data;
    if (event == PyRefTracer_CREATE) {
        other_created++;
    }
    return other_prev != NULL ? other_prev(op, event, other_prev_data) : 0;
}

static PyObject *
other_tracer_install(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    other_prev = PyRefTracer_GetTracer(&other_prev_data);
    if (PyRefTracer_SetTracer(other_tracer, NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Puts back the tracer it found if it is still on top; returns whether it was. */
static PyObject *
other_tracer_uninstall(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    void *data;
    if (PyRefTracer_GetTracer(&data) != other_tracer) {
        Py_RETURN_FALSE;
    }
    if (PyRefTracer_SetTracer(other_prev, other_prev_data) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *
other_tracer_created(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(other_created);
}

/* The name of the tracer in the slot: "none", "other" or "foreign". */
static PyObject *
ref_tracer_in_slot(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    void *data;
    PyRefTracer tracer = PyRefTracer_GetTracer(&data);
    return PyUnicode_FromString(tracer == NULL ? "none" : tracer == other_tracer ? "other" : "foreign");
}
#endif

/* Blocks reported through PyTraceMalloc_Track(), as numpy reports its array
 * data: up to numpy 2.4 a block from libc's malloc, from 2.5 one from
 * PyMem_RawMalloc moved out of domain 0 into numpy's. */

static int
parse_domain_size(PyObject *args, unsigned int *domain, Py_ssize_t *size)
{
    if (!PyArg_ParseTuple(args, "In", domain, size)) {
        return -1;
    }
    if (*size < 1) {
        PyErr_Format(PyExc_ValueError, "size must be >= 1, got %zd", *size);
        return -1;
    }
    return 0;
}

static PyObject *
block_or_error(void *ptr)
{
    return ptr != NULL ? PyLong_FromVoidPtr(ptr) : PyErr_NoMemory();
}

/* tracked_malloc(domain, size) -> address: malloc, then PyTraceMalloc_Track.
 * Built as usual the calls go through the PLT (R_X86_64_JUMP_SLOT entries),
 * built with -fno-plt through the GOT (R_X86_64_GLOB_DAT). */
static PyObject *
tracked_malloc(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int domain;
    Py_ssize_t size;
    if (parse_domain_size(args, &domain, &size) < 0) {
        return NULL;
    }
    void *ptr = malloc((size_t)size);
    if (ptr != NULL) {
        PyTraceMalloc_Track(domain, (uintptr_t)ptr, (size_t)size);
    }
    return block_or_error(ptr);
}

/* The same with the GIL released (the stdlib's function takes it itself). */
static PyObject *
tracked_malloc_nogil(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int domain;
    Py_ssize_t size;
    if (parse_domain_size(args, &domain, &size) < 0) {
        return NULL;
    }
    void *ptr;
    Py_BEGIN_ALLOW_THREADS
    ptr = malloc((size_t)size);
    if (ptr != NULL) {
        PyTraceMalloc_Track(domain, (uintptr_t)ptr, (size_t)size);
    }
    Py_END_ALLOW_THREADS
    return block_or_error(ptr);
}

/* untracked_free(domain, address): PyTraceMalloc_Untrack, then free. */
static PyObject *
untracked_free(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int domain;
    PyObject *address;
    if (!PyArg_ParseTuple(args, "IO", &domain, &address)) {
        return NULL;
    }
    void *ptr = PyLong_AsVoidPtr(address);
    if (ptr == NULL && PyErr_Occurred()) {
        return NULL;
    }
    PyTraceMalloc_Untrack(domain, (uintptr_t)ptr);
    free(ptr);
    Py_RETURN_NONE;
}

/* raw_retracked(domain, size) -> address: numpy 2.5's way, a block from
 * PyMem_RawMalloc (traced in domain 0) untracked there and tracked again in
 * domain. */
static PyObject *
raw_retracked(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int domain;
    Py_ssize_t size;
    if (parse_domain_size(args, &domain, &size) < 0) {
        return NULL;
    }
    void *ptr = PyMem_RawMalloc((size_t)size);
    if (ptr != NULL) {
        PyTraceMalloc_Untrack(0, (uintptr_t)ptr);
        PyTraceMalloc_Track(domain, (uintptr_t)ptr, (size_t)size);
    }
    return block_or_error(ptr);
}

/* raw_untracked_free(domain, address): its undoing. */
static PyObject *
raw_untracked_free(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned int domain;
    PyObject *address;
    if (!PyArg_ParseTuple(args, "IO", &domain, &address)) {
        return NULL;
    }
    void *ptr = PyLong_AsVoidPtr(address);
    if (ptr == NULL && PyErr_Occurred()) {
        return NULL;
    }
    PyTraceMalloc_Untrack(domain, (uintptr_t)ptr);
    PyMem_RawFree(ptr);
    Py_RETURN_NONE;
}

/* errno_churn(iterations, threads) -> (changed, errno seen): the service's
 * view of errno across allocator calls (see churn_t): C code reads errno
 * after such calls (CPython's _Py_wfopen frees the path between fopen() and
 * its caller's PyErr_SetFromErrno()).  `threads` pthreads churn RAW blocks
 * without the GIL while the caller churns MEM and OBJ blocks, and reports
 * blocks of its own, with it, so that the hooks' lock is contended.  (The
 * reports are made with the GIL: from 3.13 PyTraceMalloc_Track takes it, and
 * a thread without a thread state would get a new one each time.)  Returns
 * how many calls changed errno and the last value one left. */
static PyObject *
errno_churn(PyObject *self, PyObject *args)
{
    (void)self;
    Py_ssize_t iterations;
    int nthreads;
    if (!PyArg_ParseTuple(args, "ni", &iterations, &nthreads)) {
        return NULL;
    }
    if (nthreads < 0 || nthreads > 16) {
        PyErr_Format(PyExc_ValueError, "threads must be 0 to 16, got %d", nthreads);
        return NULL;
    }
    churn_t churns[17];
    pthread_t threads[16];
    int started = 0;
    for (int t = 0; t <= nthreads; t++) {
        churns[t] = (churn_t){iterations, 2048, 12345u + (unsigned)t, t == nthreads, 1, 0, 0};
    }
    for (; started < nthreads; started++) {
        if (pthread_create(&threads[started], NULL, churn_run, &churns[started]) != 0) {
            break;
        }
    }
    churn_run(&churns[nthreads]); /* with the GIL: MEM and OBJ */
    Py_BEGIN_ALLOW_THREADS
    for (int t = 0; t < started; t++) {
        pthread_join(threads[t], NULL);
    }
    Py_END_ALLOW_THREADS
    if (started < nthreads) {
        PyErr_SetString(PyExc_OSError, "pthread_create failed");
        return NULL;
    }
    long changed = 0;
    int seen = 0;
    for (int t = 0; t <= nthreads; t++) {
        changed += churns[t].changed;
        if (churns[t].changed) {
            seen = churns[t].seen;
        }
    }
    return Py_BuildValue("li", changed, seen);
}

static PyMethodDef methods[] = {
    {"raw_alloc_nogil", raw_alloc_nogil, METH_VARARGS, NULL},
    {"raw_free_nogil", raw_free_nogil, METH_O, NULL},
    {"churn_nogil", churn_nogil, METH_VARARGS, NULL},
    {"errno_churn", errno_churn, METH_VARARGS, NULL},
    {"foreign_thread_alloc_while_holding_gil", foreign_thread_alloc_while_holding_gil,
     METH_VARARGS, NULL},
    {"tracked_malloc", tracked_malloc, METH_VARARGS, NULL},
    {"tracked_malloc_nogil", tracked_malloc_nogil, METH_VARARGS, NULL},
    {"untracked_free", untracked_free, METH_VARARGS, NULL},
    {"raw_retracked", raw_retracked, METH_VARARGS, NULL},
    {"raw_untracked_free", raw_untracked_free, METH_VARARGS, NULL},
#if PY_VERSION_HEX >= 0x030D0000
    {"other_tracer_install", other_tracer_install, METH_NOARGS, NULL},
    {"other_tracer_uninstall", other_tracer_uninstall, METH_NOARGS, NULL},
    {"other_tracer_created", other_tracer_created, METH_NOARGS, NULL},
    {"ref_tracer_in_slot", ref_tracer_in_slot, METH_NOARGS, NULL},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hwtest", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__hwtest(void)
{
    return PyModule_Create(&module);
}
