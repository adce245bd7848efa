#include "reftracer.h"

#include "filter.h"
#include "hooks.h"
#include "thread.h"
#include "tracer.h"

#if HW_HAVE_REFTRACER

/* The tracer ours chains to, and whether ours went into the slot; GIL. */
static PyRefTracer prev_tracer;
static void *prev_data;
static int installed;
/* Inside our tracer on this thread: a chain that loops back to ours (a tool
 * that chained to ours, and ours to it after a restart) stops here. */
static __thread int in_tracer __attribute__((tls_model("initial-exec")));

/* An object was created in block: re-stamps the block's trace unless the
 * hooks just recorded it (a new object, stamped with this very stack). */
static inline void
object_created(PyObject *op)
{
    int state = hw_load_int(&hw_tracer.hook_state);
    /* The agent's profile re-stamps nothing: ours is called only when a
     * start in that profile found it still in the slot, under another
     * tool's. */
    const int wanted = HW_STATE_RECORDING | HW_STATE_RESTAMP;
    if ((state & wanted) != wanted || hw_tls.reentrant) {
        return;
    }
    void *block = hw_object_block(op);
    if (hw_tls.stamped == block) {
        hw_tls.stamped = NULL;
        return;
    }
    /* Installed in sample mode only when a restart in that mode found ours
     * still in the slot, under another tool's: ask the filter first. */
    if (!(state & HW_STATE_SAMPLE) || hw_filter_maybe(block)) {
        hw_hooks_restamp(block);
    }
}

static HW_COLD int
chained(PyObject *op, PyRefTracerEvent event)
{
    if (in_tracer) {
        return 0;
    }
    in_tracer = 1;
    int res = prev_tracer(op, event, prev_data);
    if (event == PyRefTracer_CREATE) {
        object_created(op);
    }
    in_tracer = 0;
    return res;
}

/* Called by _Py_NewReference and _Py_Dealloc for every object, with the
 * GIL: a destroyed object costs a few instructions, a new one not many more
 * unless it reuses a block. */
static int
ref_tracer(PyObject *op, PyRefTracerEvent event, void *data)
{
    (void)data;
    if (HW_UNLIKELY(prev_tracer != NULL)) {
        return chained(op, event);
    }
    if (event == PyRefTracer_CREATE) {
        object_created(op);
    }
    return 0;
}

int
hw_reftracer_on_top(void)
{
    void *data;
    return PyRefTracer_GetTracer(&data) == ref_tracer;
}

int
hw_reftracer_install(void)
{
    void *data;
    PyRefTracer current = PyRefTracer_GetTracer(&data);
    if (current == ref_tracer) {
        /* Still there (buried when we stopped, then put back by the tool
         * that was over it): ours again, chaining to what it chains to. */
        installed = 1;
        return 0;
    }
    prev_tracer = current;
    prev_data = data;
    if (PyRefTracer_SetTracer(ref_tracer, NULL) < 0) {
        return -1;
    }
    installed = 1;
    return 0;
}

void
hw_reftracer_reclaim(void)
{
    void *data;
    if (!installed || PyRefTracer_GetTracer(&data) != NULL) {
        return;
    }
    prev_tracer = NULL;
    prev_data = NULL;
    if (PyRefTracer_SetTracer(ref_tracer, NULL) < 0) {
        PyErr_Clear(); /* it cannot fail with the GIL held; the next call retries */
    }
}

void
hw_reftracer_uninstall(void)
{
    if (!installed || !hw_reftracer_on_top()) {
        return; /* never installed, or buried: pass through (see reftracer.h) */
    }
    if (PyRefTracer_SetTracer(prev_tracer, prev_data) < 0) {
        PyErr_Clear(); /* it cannot fail with the GIL held: stay, passing through */
        return;
    }
    /* Out of the slot, ours must never call that tracer again: its tool may
     * put ours back as its own predecessor when it goes, and be gone. */
    prev_tracer = NULL;
    prev_data = NULL;
    installed = 0;
}

#else

int
hw_reftracer_install(void)
{
    return 0;
}

void
hw_reftracer_uninstall(void)
{
}

int
hw_reftracer_on_top(void)
{
    return 0;
}

void
hw_reftracer_reclaim(void)
{
}

#endif
