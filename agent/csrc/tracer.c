#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "tracer.h"

#include <math.h>

#include "filter.h"
#include "mem.h"
#include "sampling.h"
#include "sync.h"

hw_tracer_t hw_tracer = {
    .recording = 1,
    .max_nframe = 1,
    .profile = HW_PROFILE_TRACEMALLOC,
    .mode = HW_MODE_EXACT,
    .sample_interval = HW_DEFAULT_SAMPLE_INTERVAL,
    .peak_gen = 1,
};

/* Whether the trace tables exist; GIL and hw_tables_lock. */
static int tables_ready;

void
hw_tracer_publish_state_unlocked(void)
{
    int state = 0;
    if (hw_tracer.tracing) {
        state |= HW_STATE_TRACING;
        if (hw_tracer.recording) {
            state |= HW_STATE_RECORDING;
        }
        if (hw_tracer.mode == HW_MODE_SAMPLE) {
            state |= HW_STATE_SAMPLE;
        }
        if (hw_tracer.profile == HW_PROFILE_TRACEMALLOC) {
            state |= HW_STATE_RESTAMP;
        }
    }
    __atomic_store_n(&hw_tracer.hook_state, state, __ATOMIC_RELEASE);
    hw_sample_gate_publish();
}

void
hw_weigh(size_t size, uint64_t *est_size, uint64_t *est_blocks)
{
    hw_weigh_as(hw_tracer.mode, hw_tracer.sample_interval, size, est_size, est_blocks);
}

void
hw_weigh_as(int mode, uint64_t sample_interval, size_t size, uint64_t *est_size,
            uint64_t *est_blocks)
{
    if (mode == HW_MODE_EXACT) {
        *est_size = size;
        *est_blocks = HW_COUNT_ONE;
        return;
    }
    /* p = 1 - exp(-size / interval); -expm1 keeps precision for small sizes. */
    double p = -expm1(-(double)size / (double)sample_interval);
    if (!(p > 0.0)) {
        p = 1.0 / (double)sample_interval; /* size 0: weigh as 1 byte */
    }
    double weight = 1.0 / p;
    *est_size = (uint64_t)llround((double)size * weight);
    *est_blocks = (uint64_t)llround(weight * (double)HW_COUNT_ONE);
}

hw_traces_t *
hw_domain_table_unlocked(uint32_t domain, int create)
{
    if (domain == 0) {
        return &hw_tracer.traces;
    }
    for (size_t i = 0; i < hw_tracer.ndomains; i++) {
        if (hw_tracer.domains[i].domain == domain) {
            return &hw_tracer.domains[i].traces;
        }
    }
    if (!create) {
        return NULL;
    }
    hw_domain_traces_t *grown = hw_realloc(HW_MEM_TRACER, hw_tracer.domains,
                                           (hw_tracer.ndomains + 1) * sizeof(*grown));
    if (grown == NULL) {
        return NULL;
    }
    hw_tracer.domains = grown;
    hw_domain_traces_t *entry = &grown[hw_tracer.ndomains];
    entry->domain = domain;
    if (hw_traces_init(&entry->traces) < 0) {
        return NULL;
    }
    hw_tracer.ndomains++;
    return &entry->traces;
}

HW_COLD void
hw_peak_commit_unlocked(void)
{
    hw_tracer.peak_rising = 0;
    if (++hw_tracer.peak_gen == 0) {
        /* After 2**32 commits: a stamp equal by chance would read as current. */
        hw_tb_peak_stamps_reset_unlocked();
        hw_tracer.peak_gen = 1;
    }
}

/* Before any change but an insert: a new maximum reached by inserts is
 * over, and its state is the peak state (see tracer.h). */
static inline void
peak_before_change_unlocked(void)
{
    if (HW_UNLIKELY(hw_tracer.peak_rising)) {
        hw_peak_commit_unlocked();
    }
}

/* Before tb's size changes: an older stamp means the size has not changed
 * since the committed peak state, so it is tb's size there. */
static inline void
peak_touch_unlocked(hw_traceback_t *tb)
{
    if (tb->peak_gen != hw_tracer.peak_gen) {
        tb->peak_size = tb->size;
        tb->peak_gen = hw_tracer.peak_gen;
    }
}

/* alloc: the trace is a new allocation (not a re-stamp), which counts in
 * the traceback's allocation totals (tracebacks.h). */
static inline void
account_add_unlocked(hw_traceback_t *tb, size_t size, int alloc)
{
    uint64_t est, cnt;
    hw_weigh(size, &est, &cnt);
    peak_touch_unlocked(tb);
    tb->ntraces++;
    tb->size += est;
    tb->est_blocks += cnt;
    if (alloc) {
        tb->alloc_size += est;
        tb->alloc_blocks += cnt;
    }
    hw_tracer.traced += est;
    hw_tracer.est_blocks += cnt;
}

static inline void
account_remove_unlocked(hw_traceback_t *tb, size_t size)
{
    uint64_t est, cnt;
    hw_weigh(size, &est, &cnt);
    peak_touch_unlocked(tb);
    /* The count just stored is tested from the register: a compiler that
     * reads it back merged with the next field, in one wider load, made the
     * load wait for the store to retire (half of the free path's time in
     * deep_stack). */
    uint32_t left = tb->ntraces - 1;
    tb->ntraces = left;
    tb->size -= est;
    tb->est_blocks -= cnt;
    hw_tracer.traced -= est;
    hw_tracer.est_blocks -= cnt;
    if (hw_tb_newly_unused(tb, left)) {
        hw_tb_unused_unlocked(tb);
    }
}

/* Whether the sampled-block filter counts the traces of a table: every table
 * in sample mode, so that PyTraceMalloc_Untrack() of a block that was not
 * sampled (most of numpy's) looks nothing up either.  Its count for a block
 * rises when the insert is queued, so that a free racing ahead of the queue
 * still looks the block up. */
static inline int
filtered(uint32_t domain)
{
    (void)domain;
    return hw_tracer.mode == HW_MODE_SAMPLE;
}

/* put_unlocked() when the block was traced already or out of memory. */
static HW_COLD void
put_uncommon_unlocked(int res, uint32_t domain, uintptr_t ptr, size_t size, hw_traceback_t *tb,
                      const hw_trace_t *old)
{
    if (res < 0) {
        if (filtered(domain)) {
            hw_filter_add_unlocked(ptr, -1);
        }
        hw_tb_release_if_unused_unlocked(tb);
        hw_count_dropped();
        return;
    }
    /* The block was traced already (a stale trace, or track() twice): as
     * the stdlib, the new trace replaces it.  Add before removing: both may
     * share the traceback, which must not be released in between
     * (tests/core/test_trace_table.py). */
    peak_before_change_unlocked();
    account_add_unlocked(tb, size, 1);
    if (filtered(domain)) {
        hw_filter_add_unlocked(ptr, -1);
    }
    account_remove_unlocked(hw_tb_by_id_unlocked(old->tb), old->size);
}

static inline void
put_unlocked(hw_traces_t *table, uint32_t domain, uintptr_t ptr, size_t size, hw_traceback_t *tb)
{
    hw_trace_t old;
    int res = hw_traces_put_unlocked(table, ptr, tb->id, size, &old);
    if (HW_LIKELY(res == 0)) {
        account_add_unlocked(tb, size, 1);
        hw_store_counter(&hw_tracer.ntraces, hw_tracer.ntraces + 1);
    }
    else {
        put_uncommon_unlocked(res, domain, ptr, size, tb, &old);
        if (res < 0) {
            return;
        }
    }
    if (hw_tracer.traced > hw_tracer.peak) {
        hw_tracer.peak = hw_tracer.traced;
        hw_tracer.peak_rising = 1;
    }
    hw_store_counter(&hw_tracer.recorded, hw_tracer.recorded + 1);
}

/* Returns the size of the trace it removed, or SIZE_MAX if there was none. */
static size_t
pop_unlocked(hw_traces_t *table, uint32_t domain, uintptr_t ptr)
{
    hw_trace_t trace;
    if (!hw_traces_pop_unlocked(table, ptr, &trace)) {
        return SIZE_MAX;
    }
    hw_store_counter(&hw_tracer.ntraces, hw_tracer.ntraces - 1);
    if (filtered(domain)) {
        hw_filter_add_unlocked(ptr, -1);
    }
    peak_before_change_unlocked();
    account_remove_unlocked(hw_tb_by_id_unlocked(trace.tb), trace.size);
    return trace.size;
}

static __attribute__((noinline)) void
apply_oldest_unlocked(void)
{
    hw_pending_t op = hw_tracer.pending[hw_tracer.pending_head];
    hw_tracer.pending_head = (hw_tracer.pending_head + 1) & (HW_PENDING - 1);
    __atomic_store_n(&hw_tracer.npending, hw_tracer.npending - 1, __ATOMIC_RELAXED);
    if (op.tb != NULL) {
        op.tb->pending--;
        put_unlocked(&hw_tracer.traces, 0, op.ptr, op.size, op.tb);
    }
    else {
        (void)pop_unlocked(&hw_tracer.traces, 0, op.ptr);
    }
}

/* Tables up to this many slots (1 MiB) stay in the caches: changes to them
 * are applied at once, the queue would only cost. */
#define QUEUE_FROM_SLOTS (1u << 16)

/* Whether a change goes through the queue: the table is big, or changes
 * already wait (they must apply first). */
static inline int
queued(void)
{
    return hw_tracer.npending != 0 || hw_tracer.traces.mask >= QUEUE_FROM_SLOTS;
}

/* Out of line: the hooks' path for tables that stay in the caches has no
 * use for it. */
static __attribute__((noinline)) void
queue_unlocked(uintptr_t ptr, hw_traceback_t *tb, size_t size)
{
    if (hw_tracer.npending == HW_PENDING) {
        apply_oldest_unlocked();
    }
    hw_pending_t *op =
        &hw_tracer.pending[(hw_tracer.pending_head + hw_tracer.npending) & (HW_PENDING - 1)];
    op->ptr = ptr;
    op->tb = tb;
    op->size = size;
    __atomic_store_n(&hw_tracer.npending, hw_tracer.npending + 1, __ATOMIC_RELAXED);
    hw_traces_prefetch(&hw_tracer.traces, ptr);
}

void
hw_record_unlocked(uintptr_t ptr, size_t size, hw_capture_t *cap)
{
    hw_traceback_t *tb = hw_tb_intern_unlocked(0, cap);
    if (tb == NULL) {
        hw_count_dropped();
        return;
    }
    if (filtered(0)) {
        hw_filter_add_unlocked(ptr, +1);
    }
    if (!queued()) {
        put_unlocked(&hw_tracer.traces, 0, ptr, size, tb);
        return;
    }
    tb->pending++;
    queue_unlocked(ptr, tb, size);
}

void
hw_restamp_unlocked(uintptr_t ptr, hw_capture_t *cap)
{
    hw_flush_unlocked();
    if (hw_tracer.traces.count == 0) {
        return;
    }
    /* Interned first, so that one probe finds and retags the slot: a block
     * reused in a loop is retagged with the traceback it has, then nothing
     * else changes. */
    hw_traceback_t *tb = hw_tb_intern_unlocked(0, cap);
    if (tb == NULL) {
        return; /* out of memory: the old stamp stays, better than none */
    }
    hw_trace_t old;
    if (!hw_traces_retag_unlocked(&hw_tracer.traces, ptr, tb->id, &old)) {
        hw_tb_release_if_unused_unlocked(tb);
        return;
    }
    if (old.tb == tb->id) {
        return;
    }
    /* The block's weight moves from one traceback to the other: the totals,
     * and so the peak, do not change; the peak state is committed first. */
    peak_before_change_unlocked();
    account_add_unlocked(tb, old.size, 0);
    account_remove_unlocked(hw_tb_by_id_unlocked(old.tb), old.size);
}

size_t
hw_forget_unlocked(uintptr_t ptr)
{
    if (!queued()) {
        return pop_unlocked(&hw_tracer.traces, 0, ptr);
    }
    queue_unlocked(ptr, NULL, 0);
    return SIZE_MAX;
}

void
hw_flush_unlocked(void)
{
    while (hw_tracer.npending != 0) {
        apply_oldest_unlocked();
    }
}

static void
discard_pending_unlocked(void)
{
    hw_tracer.pending_head = 0;
    __atomic_store_n(&hw_tracer.npending, 0, __ATOMIC_RELAXED);
}

void
hw_add_trace_unlocked(uint32_t domain, uintptr_t ptr, size_t size, hw_capture_t *cap)
{
    hw_flush_unlocked();
    if (domain == 0) {
        hw_record_unlocked(ptr, size, cap);
        hw_flush_unlocked();
        return;
    }
    hw_traces_t *table = hw_domain_table_unlocked(domain, 1);
    hw_traceback_t *tb = table != NULL ? hw_tb_intern_unlocked(domain, cap) : NULL;
    if (tb == NULL) {
        hw_count_dropped();
        return;
    }
    if (filtered(domain)) {
        hw_filter_add_unlocked(ptr, +1); /* put_unlocked takes it back if it fails */
    }
    put_unlocked(table, domain, ptr, size, tb);
}

int
hw_remove_trace_unlocked(uint32_t domain, uintptr_t ptr)
{
    hw_flush_unlocked();
    hw_traces_t *table = hw_domain_table_unlocked(domain, 0);
    return table != NULL && pop_unlocked(table, domain, ptr) != SIZE_MAX;
}

void
hw_tracer_reset_tables_unlocked(void)
{
    discard_pending_unlocked();
    if (tables_ready) {
        hw_traces_fini(&hw_tracer.traces);
        for (size_t i = 0; i < hw_tracer.ndomains; i++) {
            hw_traces_fini(&hw_tracer.domains[i].traces);
        }
        hw_free(HW_MEM_TRACER, hw_tracer.domains);
        hw_tracer.domains = NULL;
        hw_tracer.ndomains = 0;
        tables_ready = 0;
    }
    hw_tb_clear_unlocked();
    hw_filter_clear_unlocked();
    hw_tracer.traced = 0;
    hw_tracer.peak = 0;
    hw_peak_commit_unlocked();
    hw_tracer.est_blocks = 0;
    __atomic_store_n(&hw_tracer.ntraces, 0, __ATOMIC_RELAXED);
}

int
hw_tracer_init_tables_unlocked(void)
{
    if (tables_ready) {
        return 0;
    }
    if (hw_traces_init(&hw_tracer.traces) < 0) {
        return -1;
    }
    if (hw_tb_init_unlocked() < 0) {
        hw_traces_fini(&hw_tracer.traces);
        return -1;
    }
    tables_ready = 1;
    return 0;
}

void
hw_tracer_compact_tables_unlocked(void)
{
    if (tables_ready) {
        hw_flush_unlocked();
        hw_traces_compact_unlocked(&hw_tracer.traces);
        for (size_t i = 0; i < hw_tracer.ndomains; i++) {
            hw_traces_compact_unlocked(&hw_tracer.domains[i].traces);
        }
    }
}

void
hw_clear_traces(void)
{
    if (!hw_load_int(&hw_tracer.tracing)) {
        return;
    }
    hw_lock();
    __atomic_add_fetch(&hw_tracer.epoch, 1, __ATOMIC_RELAXED);
    hw_tracer_reset_tables_unlocked();
    if (hw_tracer_init_tables_unlocked() < 0) {
        /* Keep the hooks harmless: without tables nothing can be recorded. */
        __atomic_store_n(&hw_tracer.tracing, 0, __ATOMIC_RELEASE);
        hw_tracer_publish_state_unlocked();
    }
    hw_unlock();
    hw_graveyard_drain();
}

void
hw_reset_peak(void)
{
    hw_lock();
    hw_flush_unlocked();
    hw_tracer.peak = hw_tracer.traced;
    hw_peak_commit_unlocked();
    hw_unlock();
}

void
hw_set_epoch(uint32_t epoch)
{
    hw_lock();
    /* Queued changes happened before: they take the old epoch. */
    hw_flush_unlocked();
    size_t n = 0;
    hw_traces_t **tables = NULL;
    if (tables_ready) {
        tables = hw_malloc(HW_MEM_TRACER, (hw_tracer.ndomains + 1) * sizeof(*tables));
        if (tables != NULL) {
            tables[n++] = &hw_tracer.traces;
            for (size_t i = 0; i < hw_tracer.ndomains; i++) {
                tables[n++] = &hw_tracer.domains[i].traces;
            }
        }
    }
    /* Out of memory, the ages of older traces may be understated after
     * 2**16 epochs: better than failing the agent's cycle. */
    hw_traces_set_epoch_unlocked(epoch, tables, n);
    hw_unlock();
    hw_free(HW_MEM_TRACER, tables);
}

uint32_t
hw_get_epoch(void)
{
    hw_lock();
    uint32_t epoch = hw_traces_epoch_unlocked();
    hw_unlock();
    return epoch;
}

void
hw_get_traced(uint64_t *current, uint64_t *peak, uint64_t *est_blocks)
{
    hw_lock();
    hw_flush_unlocked();
    *current = hw_tracer.traced;
    *peak = hw_tracer.peak;
    *est_blocks = hw_tracer.est_blocks;
    hw_unlock();
}

size_t
hw_tracer_memory(void)
{
    return hw_mem_used(HW_MEM_TRACER);
}
