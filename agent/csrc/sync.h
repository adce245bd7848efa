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
 *
 * A futex lock (Drepper, "Futexes Are Tricky", mutex 3) inlined into the
 * hooks: the GIL already serializes the MEM and OBJ hooks, so the lock is
 * almost never contended and its uncontended cost (one compare-and-swap, one
 * release store: see hw_unlock) is on every traced allocation.  Contended
 * waiters spin briefly, then sleep in the kernel: a pure spinlock burnt a
 * core while the holder waited for one (tests/core/test_stress.py went from
 * seconds to minutes).
 * States: 0 free, 1 held, 2 held with possible sleepers.
 *
 * errno is the service's: C code reads it after calls that allocate or free
 * on their way out (CPython's _Py_wfopen frees the path between fopen() and
 * its caller's PyErr_SetFromErrno()), and the hooks run inside those calls.
 * So whatever of ours may set errno keeps it itself: the futex calls (sync.c),
 * the tracer's memory (mem.h), the pending call that drains the graveyard,
 * the sampler's seeding, the GOT patching.  The hooks' hot paths, which
 * make no such call, then pay nothing for it.
 */
#ifndef HEAPWATCH_SYNC_H
#define HEAPWATCH_SYNC_H

extern int hw_tables_lock;

/* sync.c: the contended paths, out of line and cold, so that the inlined
 * fast paths below stay a compare-and-swap and a store. */
void hw_lock_contended(void);
void hw_unlock_wake(void);

static inline void
hw_lock(void)
{
    int expected = 0;
    if (__builtin_expect(__atomic_compare_exchange_n(&hw_tables_lock, &expected, 1, 0,
                                                     __ATOMIC_ACQUIRE, __ATOMIC_RELAXED),
                         1)) {
        return;
    }
    hw_lock_contended();
}

static inline void
hw_unlock(void)
{
    /* Held without sleepers (1), the common case: a plain release store,
     * which does not wait for the stores before it as an exchange does.  A
     * waiter that announces itself (2) between the load and the store has
     * that announcement overwritten and may sleep through this release: it
     * sleeps with a timeout (hw_lock_contended), so a lost wake-up costs it
     * at most that. */
    if (__builtin_expect(__atomic_load_n(&hw_tables_lock, __ATOMIC_RELAXED) == 1, 1)) {
        __atomic_store_n(&hw_tables_lock, 0, __ATOMIC_RELEASE);
        return;
    }
    if (__atomic_exchange_n(&hw_tables_lock, 0, __ATOMIC_RELEASE) == 2) {
        hw_unlock_wake();
    }
}

#endif
