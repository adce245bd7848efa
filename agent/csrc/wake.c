#include "wake.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#include "sampling.h"
#include "thread.h"

#include <frameobject.h>

/* Allocations between two reads of the clock: a read costs some 20 ns, an
 * allocation through the hooks about as much, and a service that allocates
 * at all allocates thousands of blocks a second. */
#define WAKE_CHECK_EVERY 64

int hw_wake_armed;
/* What the wake-up calls, a strong reference, and when: the GIL guards both,
 * and the countdown of allocations to the next clock read. */
static PyObject *wake_callback;
static int64_t wake_deadline_ns;
static unsigned int wake_countdown;

/* GIL.  The fast path of sample mode leaves for the slow path, where the
 * clock is read, only as often as the countdown's cap makes it. */
static void
set_armed(int armed)
{
    __atomic_store_n(&hw_wake_armed, armed, __ATOMIC_RELAXED);
    hw_gil_countdown_cap(armed);
}

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Calls and releases callback: the main thread, the GIL held, between two
 * bytecodes (a pending call). */
static void
run_callback(PyObject *callback)
{
    if (hw_py_is_finalizing()) {
        /* The interpreter is going away: no Python code now (the reference
         * is left, as the interpreter's own are). */
        return;
    }
    PyObject *result = PyObject_CallNoArgs(callback);
    if (result == NULL) {
        /* The callback logs its own failures; whatever escapes it must not
         * surface in the service's code, where the pending call runs. */
        PyErr_Clear();
    }
    Py_XDECREF(result);
    Py_DECREF(callback);
}

static int
wake_pending_call(void *arg)
{
    (void)arg;
    PyObject *callback = wake_callback;
    wake_callback = NULL;
    if (callback != NULL) { /* else disarmed meanwhile */
        run_callback(callback);
    }
    return 0;
}

/* A call_soon: what to call, and the frame it waits for (NULL: none). */
typedef struct {
    PyObject *callback;
    PyObject *frame;
    unsigned int requeued;
} soon_t;

/* Times a call_soon waiting for its frame is queued again (32 a safe point
 * at most: the pending calls' own batch), should the frame never run again. */
#define SOON_MAX_REQUEUES 100000

static int
soon_pending_call(void *arg)
{
    soon_t *soon = (soon_t *)arg;
    if (soon->frame != NULL && (PyObject *)PyEval_GetFrame() != soon->frame &&
        soon->requeued < SOON_MAX_REQUEUES && !hw_py_is_finalizing()) {
        /* Another frame's safe point (a hook that os.fork() runs, say):
         * queued again, for the next one. */
        soon->requeued++;
        if (Py_AddPendingCall(soon_pending_call, soon) == 0) {
            return 0;
        }
    }
    PyObject *callback = soon->callback;
    Py_XDECREF(soon->frame);
    PyMem_RawFree(soon);
    run_callback(callback);
    return 0;
}

int
hw_call_soon(PyObject *callback, PyObject *frame)
{
    if (!PyCallable_Check(callback)) {
        PyErr_Format(PyExc_TypeError, "callback must be callable, not %.100s",
                     Py_TYPE(callback)->tp_name);
        return -1;
    }
    if (frame != NULL && !PyFrame_Check(frame)) {
        PyErr_Format(PyExc_TypeError, "frame must be a frame or None, not %.100s",
                     Py_TYPE(frame)->tp_name);
        return -1;
    }
    soon_t *soon = PyMem_RawMalloc(sizeof(*soon));
    if (soon == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(callback);
    Py_XINCREF(frame);
    soon->callback = callback;
    soon->frame = frame;
    soon->requeued = 0;
    if (Py_AddPendingCall(soon_pending_call, soon) != 0) {
        Py_DECREF(callback);
        Py_XDECREF(frame);
        PyMem_RawFree(soon);
        PyErr_SetString(PyExc_RuntimeError, "the interpreter's pending calls are full");
        return -1;
    }
    return 0;
}
HW_COLD void
hw_wake_tick(void)
{
    /* Not from inside our own hooks (a nested allocation): the tables' lock
     * may be held, and a pending call's lock is not one to take there. */
    if (hw_tls.reentrant) {
        return;
    }
    /* In sample mode only what leaves the fast path gets here: at least one
     * allocation per stride (sampling.h), and a read of the clock costs
     * little beside the slow path it takes. */
    if (!hw_sampling_open() && --wake_countdown != 0) {
        return;
    }
    wake_countdown = WAKE_CHECK_EVERY;
    if (now_ns() < wake_deadline_ns) {
        return;
    }
    /* Disarmed first: should queueing allocate, the nested call must not
     * queue it again. */
    __atomic_store_n(&hw_wake_armed, 0, __ATOMIC_RELAXED);
    int err = errno; /* the pending calls' lock may sleep: see sync.h */
    if (Py_AddPendingCall(wake_pending_call, NULL) != 0) {
        /* The queue is full: tried again at a later allocation. */
        __atomic_store_n(&hw_wake_armed, 1, __ATOMIC_RELAXED);
    }
    else {
        hw_gil_countdown_cap(0);
    }
    errno = err;
}

int
hw_wake_arm(double delay, PyObject *callback)
{
    if (!isfinite(delay) || delay < 0.0) {
        PyErr_SetString(PyExc_ValueError,
                        "wake-up delay must be a finite number of seconds >= 0");
        return -1;
    }
    if (!PyCallable_Check(callback)) {
        PyErr_Format(PyExc_TypeError, "wake-up callback must be callable, not %.100s",
                     Py_TYPE(callback)->tp_name);
        return -1;
    }
    PyObject *previous = wake_callback;
    Py_INCREF(callback);
    wake_callback = callback;
    wake_deadline_ns = now_ns() + (int64_t)(delay * 1e9);
    wake_countdown = 1; /* the first allocation reads the clock */
    set_armed(1);
    Py_XDECREF(previous);
    return 0;
}

int
hw_wake_disarm(void)
{
    set_armed(0);
    PyObject *callback = wake_callback;
    wake_callback = NULL;
    Py_XDECREF(callback);
    return callback != NULL;
}
