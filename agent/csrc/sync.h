/* The tables lock.
 *
 * hw_tables_lock guards the trace tables, the interned tracebacks and raw
 * names, the id vector, the graveyard and the traced-memory counters.
 *
 * Lock order: the GIL, if a thread has it, is taken before hw_tables_lock.
 * Code holding hw_tables_lock never waits for the GIL, never runs Python code
 * and never allocates through PyMem (our own hooks would take the lock again);
 * the tracer's memory comes from mem.h.  So a thread that released the GIL and
 * allocates through PyMem_RawMalloc can always finish its hook.
 */
#ifndef HEAPWATCH_SYNC_H
#define HEAPWATCH_SYNC_H

#include <pthread.h>

extern pthread_mutex_t hw_tables_lock;

static inline void
hw_lock(void)
{
    pthread_mutex_lock(&hw_tables_lock);
}

static inline void
hw_unlock(void)
{
    pthread_mutex_unlock(&hw_tables_lock);
}

#endif
