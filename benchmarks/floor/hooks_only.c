/* The floor of sample mode: allocator hooks that only forward.
 *
 * They wrap the calls heapwatch's sampling set wraps above plain pymalloc
 * (RAW malloc, calloc, realloc and free; MEM and OBJ malloc, calloc and
 * realloc; MEM's and OBJ's free stay pymalloc's own) and do nothing else.
 * What they cost is what any hook in those places costs: the extra calls,
 * and, on an interpreter built with PGO and LTO, the pymalloc fast path
 * its callers inline behind a check that the allocator is still pymalloc.
 * Sample mode's own cost is what it adds to this.
 *
 * start_countdown() puts in the same hooks with what any sampler by bytes
 * must add to each call: the bytes taken off a countdown, and a branch for
 * when it runs out (it never does here).  The least a byte sampler can
 * cost, short of taking samples.
 *
 * A benchmark, not part of heapwatch: benchmarks/floor.py builds it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { D_RAW, D_MEM, D_OBJ, D_COUNT };

static const PyMemAllocatorDomain domains[D_COUNT] = {
    PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ,
};

/* The allocators under ours; written by start() with the GIL, before our
 * hooks go in, and kept after stop() for a call through a stale pointer. */
static PyMemAllocatorEx wrapped[D_COUNT];
/* Our hooks are in the chain; GIL. */
static int installed;
/* The countdown hooks' bytes left; GIL for MEM and OBJ, a benign race for
 * RAW (a lost update only moves a point that is never reached). */
static long long countdown;
/* How often it ran out: a check that it never does. */
static long long ran_out;

/* Far enough never to be reached in a benchmark run; a run out takes it
 * there again. */
#define NEVER (1LL << 50)

static __attribute__((noinline, cold)) void
run_out(void)
{
    ran_out++;
    countdown = NEVER;
}

#define FORWARDERS(D)                                                               \
    static void *malloc_##D(void *ctx, size_t size)                                 \
    {                                                                               \
        return wrapped[D].malloc(ctx, size);                                        \
    }                                                                               \
    static void *calloc_##D(void *ctx, size_t nelem, size_t elsize)                 \
    {                                                                               \
        return wrapped[D].calloc(ctx, nelem, elsize);                               \
    }                                                                               \
    static void *realloc_##D(void *ctx, void *ptr, size_t size)                     \
    {                                                                               \
        return wrapped[D].realloc(ctx, ptr, size);                                  \
    }

/* As heapwatch's fast path: charge the bytes, then forward in a tail call. */
static inline void
charge(size_t size)
{
    long long left = countdown - (long long)size;
    if (__builtin_expect(left <= 0, 0)) {
        run_out();
    }
    else {
        countdown = left;
    }
}

#define COUNTERS(D)                                                                 \
    static void *cmalloc_##D(void *ctx, size_t size)                                \
    {                                                                               \
        charge(size);                                                               \
        return wrapped[D].malloc(ctx, size);                                        \
    }                                                                               \
    static void *ccalloc_##D(void *ctx, size_t nelem, size_t elsize)                \
    {                                                                               \
        charge(nelem * elsize);                                                     \
        return wrapped[D].calloc(ctx, nelem, elsize);                               \
    }                                                                               \
    static void *crealloc_##D(void *ctx, void *ptr, size_t size)                    \
    {                                                                               \
        charge(size);                                                               \
        return wrapped[D].realloc(ctx, ptr, size);                                  \
    }

FORWARDERS(D_RAW)
FORWARDERS(D_MEM)
FORWARDERS(D_OBJ)
COUNTERS(D_RAW)
COUNTERS(D_MEM)
COUNTERS(D_OBJ)

static void
free_D_RAW(void *ctx, void *ptr)
{
    wrapped[D_RAW].free(ctx, ptr);
}

/* A set of hooks, domain by domain; a NULL free leaves the domain's own
 * (MEM's and OBJ's stay pymalloc's, as in heapwatch's sampling set). */
static const PyMemAllocatorEx forwarding[D_COUNT] = {
    {NULL, malloc_D_RAW, calloc_D_RAW, realloc_D_RAW, free_D_RAW},
    {NULL, malloc_D_MEM, calloc_D_MEM, realloc_D_MEM, NULL},
    {NULL, malloc_D_OBJ, calloc_D_OBJ, realloc_D_OBJ, NULL},
};
static const PyMemAllocatorEx counting[D_COUNT] = {
    {NULL, cmalloc_D_RAW, ccalloc_D_RAW, crealloc_D_RAW, free_D_RAW},
    {NULL, cmalloc_D_MEM, ccalloc_D_MEM, crealloc_D_MEM, NULL},
    {NULL, cmalloc_D_OBJ, ccalloc_D_OBJ, crealloc_D_OBJ, NULL},
};

static PyObject *
install(const PyMemAllocatorEx set[D_COUNT])
{
    if (!installed) {
        countdown = NEVER;
        for (int d = 0; d < D_COUNT; d++) {
            PyMem_GetAllocator(domains[d], &wrapped[d]);
            PyMemAllocatorEx hook = wrapped[d];
            hook.malloc = set[d].malloc;
            hook.calloc = set[d].calloc;
            hook.realloc = set[d].realloc;
            if (set[d].free != NULL) {
                hook.free = set[d].free;
            }
            PyMem_SetAllocator(domains[d], &hook);
        }
        installed = 1;
    }
    Py_RETURN_NONE;
}

static PyObject *
floor_start(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return install(forwarding);
}

static PyObject *
floor_start_countdown(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return install(counting);
}

static PyObject *
floor_ran_out(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLongLong(ran_out);
}

static PyObject *
floor_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (installed) {
        for (int d = 0; d < D_COUNT; d++) {
            PyMem_SetAllocator(domains[d], &wrapped[d]);
        }
        installed = 0;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"start", floor_start, METH_NOARGS, "Put the forwarding hooks in."},
    {"start_countdown", floor_start_countdown, METH_NOARGS,
     "Put the counting hooks in: forwarding, and a countdown of bytes."},
    {"ran_out", floor_ran_out, METH_NOARGS, "How often the countdown ran out (never, meant)."},
    {"stop", floor_stop, METH_NOARGS, "Take them out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hw_bench_floor",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit_hw_bench_floor(void)
{
    return PyModule_Create(&module_def);
}
