/* The hooks' per-thread state, in two parts.
 *
 * hw_tls, a few words of static TLS that the hooks read on every call: the
 * re-entrancy flag, the sampling fast path and countdown (sampling.h).  It
 * needs no allocation, so every thread has it from its first call on.
 *
 * hw_thread_t, what the calling thread saw last: the capture memo and the
 * traceback cache, allocated at its first traced allocation.  A thread's
 * state belongs to it alone and is read and written without a lock.  The
 * registry of all states (hw_tables_lock) only serves to free them: a thread
 * frees its own at exit, a forked child frees those of the threads it does
 * not have.
 */
#ifndef HEAPWATCH_THREAD_H
#define HEAPWATCH_THREAD_H

#include <stdint.h>

#include "compat.h"

typedef struct {
    uint32_t fast;     /* hw_sample_gate when the fast path is open to this thread, else 0 */
    int reentrant;     /* inside one of our hooks: nested calls pass through */
    /* One of heapwatch's own threads (set_thread_traced(False)): the blocks it
     * allocates are not recorded, so heapwatch's work is never shown as the
     * service's memory; its frees are still seen (a traced block it frees
     * leaves no stale trace), and its sampling decisions are still drawn (the
     * service's blocks keep their probability). */
    int own;
    int64_t countdown; /* bytes to the next sample point */
    uint32_t rng_gen;  /* hw_rng_generation this thread was seeded in */
    uint64_t rng;      /* xorshift64* state */
    /* The block the thread's hooks recorded last, until the reference tracer
     * sees an object created in it (reftracer.c); 3.13+. */
    void *stamped;
} hw_tls_t;

/* Thread-local.  initial-exec: a few bytes of static TLS make every access a
 * plain %fs-relative load on the hot path. */
extern __thread hw_tls_t hw_tls __attribute__((tls_model("initial-exec")));

/* Recent tracebacks of the thread, by the hash of their innermost frame: a
 * hit spares hashing the capture and probing the interned set.  A loop
 * allocates at a dozen lines or more (the churn benchmark: eleven, which
 * eight ways missed a third of the time). */
#define HW_TBCACHE_BITS 6
#define HW_TBCACHE_WAYS (1 << HW_TBCACHE_BITS)

struct hw_memo;
struct hw_traceback;

typedef struct hw_thread {
    struct hw_memo *memo; /* capture.c: the last stack walked; NULL until needed */
    /* tracebacks.c: valid while gen equals the traceback generation, which
     * moves whenever a traceback is freed or rewritten; hw_tables_lock held
     * to read or fill, since other threads free tracebacks under it. */
    struct {
        struct hw_traceback *tb;
        uint64_t gen;
    } tbcache[HW_TBCACHE_WAYS];
    struct hw_thread *prev, *next; /* the registry: hw_tables_lock */
} hw_thread_t;

/* The calling thread's state: NULL before its first traced allocation,
 * HW_THREAD_GONE once its thread-exit destructor ran (allocations made by
 * later destructors do without rather than create a state nobody frees). */
extern __thread hw_thread_t *hw_my_thread __attribute__((tls_model("initial-exec")));
#define HW_THREAD_GONE ((hw_thread_t *)1)

/* Creates the calling thread's state; NULL if it cannot.  Takes
 * hw_tables_lock: it must not be held. */
hw_thread_t *hw_thread_create(void);

/* The calling thread's state, or NULL.  hw_tables_lock must not be held
 * (the first call creates the state). */
static inline hw_thread_t *
hw_thread(void)
{
    hw_thread_t *thread = hw_my_thread;
    if (HW_LIKELY((uintptr_t)thread > (uintptr_t)HW_THREAD_GONE)) {
        return thread;
    }
    return thread == NULL ? hw_thread_create() : NULL;
}

/* The calling thread's state if it has one; never creates it (any lock). */
static inline hw_thread_t *
hw_thread_if_any(void)
{
    hw_thread_t *thread = hw_my_thread;
    return (uintptr_t)thread > (uintptr_t)HW_THREAD_GONE ? thread : NULL;
}

/* Once, at import: the thread-exit destructor.  Returns -1 with an exception
 * set. */
int hw_thread_init_once(void);
/* Forked child, hw_tables_lock held: frees the states of the threads that
 * do not exist in the child. */
void hw_thread_fork_child_unlocked(void);

/* capture.c: frees a memo (at thread exit). */
void hw_memo_free(struct hw_memo *memo);

#endif
