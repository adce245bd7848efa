/* The reference tracer (CPython 3.13+): an object created from a free list
 * reuses a block without an allocation, so the hooks never see it; the
 * stdlib re-stamps the block's trace with the creating traceback when
 * _Py_NewReference reports the object (PyRefTracer_SetTracer), and so do we
 * in exact mode.  Sample mode does without: the tracer is called for every
 * object created or destroyed, which costs more than sampling itself.
 *
 * The interpreter has one tracer slot.  Ours chains to the tracer it found
 * there, and stop puts that one back if ours is still on top; otherwise
 * (another tool installed over ours) ours stays in the chain, passing
 * through, so that tool keeps working.
 */
#ifndef HEAPWATCH_REFTRACER_H
#define HEAPWATCH_REFTRACER_H

#include "compat.h"

/* GIL held.  Returns -1 with an exception set. */
int hw_reftracer_install(void);
/* GIL held. */
void hw_reftracer_uninstall(void);
/* GIL held, tracing.  Puts ours back in a slot that somebody emptied: the
 * stdlib's stop() clears the slot, ours included, when it was installed
 * over ours.  Snapshots and drains call it. */
void hw_reftracer_reclaim(void);
/* 1 if our tracer is the one in the interpreter's slot. */
int hw_reftracer_on_top(void);

#endif
