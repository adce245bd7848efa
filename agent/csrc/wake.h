/* The wake-up: one Python callable run from the main thread at a safe point
 * (a pending call) once the process has allocated past a deadline.
 *
 * A forked child starts no thread of heapwatch's until it has lived long
 * enough to need one (docs/design/agent.md, "Fork"): without a thread, what
 * notices the deadline is the allocator.  While a wake-up is armed, the
 * MEM and OBJ hooks read the monotonic clock off their fast path: in exact
 * mode at every WAKE_CHECK_EVERY-th allocation, in sample mode at each
 * allocation that leaves it, at least once per HW_WAKE_STRIDE bytes
 * (sampling.h).  The first read past the deadline disarms and queues the
 * call.  Disarmed (the normal state, the parent's), the sample mode fast
 * path pays nothing, the others one load of hw_wake_armed and a branch never
 * taken.  A process that allocates nothing (asleep, blocked in C) is never
 * woken: nothing of ours runs in it.
 */
#ifndef HEAPWATCH_WAKE_H
#define HEAPWATCH_WAKE_H

#include <Python.h>

#include "compat.h"

/* Nonzero while a wake-up is armed.  Written with the GIL (arm, disarm, the
 * tick that fires); read by the MEM and OBJ hooks, which hold the GIL too,
 * but through an atomic load, as the compiler cannot know that. */
extern int hw_wake_armed;

/* The hooks' side, off the sample mode fast path: GIL held, any thread,
 * never raises, never calls Python. */
void hw_wake_tick(void);

static inline void
hw_wake_check(void)
{
    if (HW_UNLIKELY(__atomic_load_n(&hw_wake_armed, __ATOMIC_RELAXED))) {
        hw_wake_tick();
    }
}

/* GIL held.  Arms a wake-up: callback() runs once, in the main thread, at
 * the first safe point after an allocation made delay seconds or more from
 * now.  Replaces a wake-up armed before.  Returns -1 with an exception set
 * on a negative or non-finite delay. */
int hw_wake_arm(double delay, PyObject *callback);
/* GIL held.  Forgets the armed wake-up, if any; returns whether there was
 * one.  A call already queued then does nothing. */
int hw_wake_disarm(void);

/* GIL held.  callback() once, from the main thread at its next safe point
 * (a pending call: right after the builtin being called returns), or, given
 * a frame, at the next safe point of that frame (the code that called
 * os.fork(), once it returned: not the at-fork hooks it runs before).
 * Returns -1 with an exception set on a wrong argument or when the queue of
 * pending calls is full. */
int hw_call_soon(PyObject *callback, PyObject *frame);

#endif
