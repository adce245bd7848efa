/* The tracer: its configuration, its trace tables and counters, and the
 * operations that keep the three consistent.
 *
 * Invariants (hw_tables_lock held): every trace slot names a live interned
 * traceback; a traceback's ntraces, size and est_blocks are the number and the
 * weighed sums of the slots naming it; hw_tracer.traced and est_blocks are the
 * sums over all tracebacks.  tests/core/test_stress.py checks them through
 * _core._check_invariants() under concurrent churn.
 *
 * Per-site peaks: hw_tracer.peak is the interval's peak of traced; each
 * traceback's size in the state where traced reached it is kept in O(1) per
 * change, never with a pass over the tracebacks at a new peak.  The peak
 * state is committed lazily at the falling edge: while traced sits at a new
 * maximum reached by inserts (peak_rising), the current sizes are the peak's;
 * the first other change (a removal, a replacement, a restamp) commits that
 * state by moving peak_gen on, and so does a peak reset.  A traceback whose
 * peak_gen is older has not changed since the commit, so its current size is
 * its peak size; before its size changes, it copies that size into peak_size
 * and takes the current peak_gen.  Hence, hw_tables_lock held and the queue
 * applied: with peak_rising, traced == peak; without, the peak sizes of the
 * interned tracebacks sum to peak (_check_invariants checks both).  Idle
 * tracebacks holding a peak are not swept (tracebacks.h).
 *
 * Weights: in exact mode a trace weighs (size, 1 block).  In sampling mode a
 * block of s bytes is sampled with probability p = 1 - exp(-s / interval), so
 * a sampled trace weighs (s / p, 1 / p): the estimates are unbiased.  Weights
 * are integers computed from the size alone, so removing a trace subtracts
 * exactly what adding it added and the sums never drift.
 */
#ifndef HEAPWATCH_TRACER_H
#define HEAPWATCH_TRACER_H

#include <stdint.h>

#include "compat.h"
#include "traces.h"
#include "tracebacks.h"

#define HW_COUNT_SHIFT 20
#define HW_COUNT_ONE ((uint64_t)1 << HW_COUNT_SHIFT)

enum { HW_MODE_EXACT = 0, HW_MODE_SAMPLE = 1 };

/* What the tracer records besides each block's size and first frames.
 * HW_PROFILE_TRACEMALLOC: the stdlib's semantics, which the drop-in keeps:
 * total_nframe is the stack's whole depth, and a block a free list hands
 * back is re-stamped with its new object's traceback (3.13+, exact mode).
 * HW_PROFILE_AGENT: what the agent exports and nothing more: neither the
 * depth (total_nframe is the frames kept, plus one when the stack goes
 * deeper) nor re-stamps.  Set at start; a start asking for the stdlib's
 * semantics while the agent's profile traces raises it (never the other
 * way). */
enum { HW_PROFILE_TRACEMALLOC = 0, HW_PROFILE_AGENT = 1 };

/* Bits of hw_tracer.hook_state: what the hooks need, in one load. */
#define HW_STATE_TRACING 1
#define HW_STATE_RECORDING 2
#define HW_STATE_SAMPLE 4
#define HW_STATE_RESTAMP 8 /* the profile wants re-stamps (reftracer.c) */

#define HW_DEFAULT_SAMPLE_INTERVAL (512u * 1024u)
/* The largest mean sample interval, in bytes (1 TiB): the countdowns draw
 * from an exponential distribution whose mean must stay far below 2**63. */
#define HW_MAX_SAMPLE_INTERVAL ((unsigned long long)1 << 40)

typedef struct {
    uint32_t domain;
    hw_traces_t traces;
} hw_domain_traces_t;

/* A change to the hooks' trace table waiting to be applied (see
 * hw_record_unlocked). */
typedef struct {
    uintptr_t ptr;
    hw_traceback_t *tb; /* NULL: the block was freed */
    size_t size;
} hw_pending_t;

/* Changes in flight: a power of two. */
#define HW_PENDING 64

typedef struct {
    /* Configuration: written with the GIL and hw_tables_lock held, read by the
     * hooks with relaxed atomic loads. */
    int tracing;
    int recording; /* cleared at interpreter exit: frees still untrack */
    uint32_t epoch; /* bumped by start, stop and clear: in-flight captures of
                       an older epoch are discarded */
    int max_nframe;
    int profile; /* HW_PROFILE_*, read beside max_nframe by every capture */
    int mode;
    uint64_t sample_interval;
    int hook_state; /* HW_STATE_* bits derived from the fields above */

    /* Guarded by hw_tables_lock; on other cache lines than the fields above,
     * which every hook of every thread reads. */
    hw_traces_t traces __attribute__((aligned(64))); /* domain 0: what the hooks record */
    hw_pending_t pending[HW_PENDING]; /* changes to traces not applied yet, oldest first */
    uint32_t pending_head;
    uint32_t npending; /* also read without the lock (relaxed): see maybe_traced */
    hw_domain_traces_t *domains; /* other domains (the track() API) */
    size_t ndomains;
    uint64_t traced;   /* estimated live bytes (exact in exact mode) */
    uint64_t peak;
    uint32_t peak_gen;  /* moves at each peak commit; never 0 (see above) */
    int peak_rising;    /* traced is a new maximum not committed yet */
    uint64_t est_blocks; /* estimated live blocks, HW_COUNT_ONE units */

    /* Written with hw_tables_lock held, read without it (relaxed atomics:
     * a locked read-modify-write is not needed under the lock). */
    uint64_t ntraces;  /* entries in all trace tables */
    uint64_t recorded; /* traces recorded since start */
    /* Atomic read-modify-write: also counted without the lock. */
    uint64_t dropped; /* traces lost: no memory for them */
} hw_tracer_t;

extern hw_tracer_t hw_tracer;

static inline int
hw_load_int(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void
hw_store_counter(uint64_t *counter, uint64_t value)
{
    __atomic_store_n(counter, value, __ATOMIC_RELAXED);
}

/* Whether captures count the stack's whole depth (hw_capture). */
static inline int
hw_counts_depth(void)
{
    return hw_load_int(&hw_tracer.profile) == HW_PROFILE_TRACEMALLOC;
}

static inline void
hw_count_dropped(void)
{
    __atomic_add_fetch(&hw_tracer.dropped, 1, __ATOMIC_RELAXED);
}

void hw_weigh(size_t size, uint64_t *est_size, uint64_t *est_blocks);
/* The same for a snapshot's mode and sample interval. */
void hw_weigh_as(int mode, uint64_t sample_interval, size_t size, uint64_t *est_size,
                 uint64_t *est_blocks);

/* tb's size in the interval's peak state; hw_tables_lock held, queue applied. */
static inline uint64_t
hw_tb_peak_unlocked(const hw_traceback_t *tb)
{
    if (hw_tracer.peak_rising || tb->peak_gen != hw_tracer.peak_gen) {
        return tb->size;
    }
    return tb->peak_size;
}

/* Whether tb's peak size is its own, no longer its current size: a sweep
 * must keep it. */
static inline int
hw_tb_holds_peak_unlocked(const hw_traceback_t *tb)
{
    return tb->peak_gen == hw_tracer.peak_gen && tb->peak_size != 0;
}

/* Takes the current state as the interval's peak state (a peak reset). */
void hw_peak_commit_unlocked(void);

/* The hooks' changes to their table (domain 0), hw_tables_lock held.
 *
 * A trace table of a million blocks is far bigger than the caches, and every
 * insert or removal at a random slot waited for memory (the dict_1m
 * benchmark spent most of its tracing time there).  So, once the table
 * outgrows the caches, the hooks queue their changes: each one prefetches its
 * slot and is applied HW_PENDING changes later, when the slot is in cache
 * (8 changes ahead was too close: dict_1m 2.9x untraced; 32 and 64, 1.7 to
 * 1.8x; 128 no better).  Changes apply in order, so the table,
 * the sums and the peak go through exactly the states they would have gone
 * through at once; whoever reads them calls hw_flush_unlocked() first.  A
 * queued traceback is kept from being freed by its pending count.
 *
 * A trace that cannot be recorded counts as dropped. */
void hw_record_unlocked(uintptr_t ptr, size_t size, hw_capture_t *cap);
/* Gives the trace of ptr, if it has one, the traceback of cap (sizes and
 * sums unchanged). */
void hw_restamp_unlocked(uintptr_t ptr, hw_capture_t *cap);
/* Returns the size of the trace it removed at once, or SIZE_MAX: queued, or
 * no trace. */
size_t hw_forget_unlocked(uintptr_t ptr);
/* Applies every queued change. */
void hw_flush_unlocked(void);

/* Changes made through the track() API, applied at once (after the queue),
 * hw_tables_lock held.  hw_remove_trace_unlocked returns 1 if ptr was traced. */
void hw_add_trace_unlocked(uint32_t domain, uintptr_t ptr, size_t size, hw_capture_t *cap);
int hw_remove_trace_unlocked(uint32_t domain, uintptr_t ptr);
/* hw_tables_lock held.  The traced table of a domain, or NULL. */
hw_traces_t *hw_domain_table_unlocked(uint32_t domain, int create);

/* The tables through start, stop and clear (lifecycle.h), GIL and
 * hw_tables_lock held.  init creates them unless they exist; -1 out of
 * memory.  reset drops every trace and traceback: pinned tracebacks survive
 * for their snapshots.  compact applies the queue and shrinks the tables
 * toward their live traces. */
int hw_tracer_init_tables_unlocked(void);
void hw_tracer_reset_tables_unlocked(void);
void hw_tracer_compact_tables_unlocked(void);
/* Recomputes the hooks' state word from tracing, recording and mode; called
 * with hw_tables_lock held after any of them changes. */
void hw_tracer_publish_state_unlocked(void);

/* The Python-facing operations: GIL held, hw_tables_lock not held (start
 * and stop: lifecycle.h). */
void hw_clear_traces(void);
void hw_reset_peak(void);
/* The age epoch (traces.h): new traces get it; it never moves back. */
void hw_set_epoch(uint32_t epoch);
uint32_t hw_get_epoch(void);
void hw_get_traced(uint64_t *current, uint64_t *peak, uint64_t *est_blocks);
size_t hw_tracer_memory(void);

#endif
