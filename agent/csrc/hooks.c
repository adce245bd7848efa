#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "hooks.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "compat.h"
#include "filter.h"
#include "sampling.h"
#include "sync.h"
#include "thread.h"
#include "tracebacks.h"
#include "tracer.h"
#include "routes.h"
#include "wake.h"

enum { D_RAW = 0, D_MEM = 1, D_OBJ = 2, D_COUNT = 3 };

static const PyMemAllocatorDomain py_domains[D_COUNT] = {
    PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ,
};

/* The allocators our hooks wrap.  Written by install (GIL held) before our
 * hooks enter the chain and never cleared, so a call that reaches a hook
 * through a stale pointer (another thread reading the allocator while we
 * swap it) still finds a valid allocator. */
static PyMemAllocatorEx hw_saved[D_COUNT];
/* The allocator under our hooks was plain pymalloc when they went in (no
 * debug hooks, no other tool's); GIL. */
static int pymalloc_below;
/* Which of our sets is in the allocator chain, perhaps below another hook
 * (see install_set).  HOOKS_RAW_BACKED, the sampling set, is sampling_hooks but for
 * free: sampled MEM and OBJ blocks of 1 to 512 bytes are then allocated
 * above pymalloc's threshold, so that pymalloc serves them from the raw
 * allocator and frees them through it, that is through our RAW hook.
 * Written with the GIL, read by the hooks (raw_backed). */
enum { HOOKS_NONE, HOOKS_EXACT, HOOKS_SAMPLING, HOOKS_RAW_BACKED };
static int hooks_set;
/* A pending call to drain the graveyard is queued; atomic. */
static int drain_queued;
/* The interpreter whose code objects the tables may hold references to:
 * heapwatch._core loads in the main interpreter only.  Another one (3.12+:
 * with a GIL of its own) allocates through the same process-wide hooks, and
 * its frames' code objects must not be referenced nor released from here, so
 * its blocks are recorded without frames.  Written once at import. */
static PyInterpreterState *main_interp;
/* Fork handlers registered; GIL. */
static int fork_handlers_registered;
/* The forking thread's reentrant flag across fork(); only that thread
 * touches it, between prepare and parent/child. */
static int fork_saved_reentrant;

/* Code references waiting in the graveyard before we ask the main thread
 * to release them (the agent's cycle and every snapshot drain it too). */
#define GRAVEYARD_DRAIN_AT 4096

static int
drain_pending_call(void *arg)
{
    (void)arg;
    __atomic_store_n(&drain_queued, 0, __ATOMIC_RELAXED);
    hw_graveyard_drain();
    return 0;
}

/* GIL held, hw_tables_lock not held.  Py_AddPendingCall neither allocates
 * nor runs Python code; the drain runs later at a safe point. */
static HW_COLD void
queue_drain(void)
{
    if (!(hw_load_int(&hw_tracer.hook_state) & HW_STATE_RECORDING)) {
        return;
    }
    if (__atomic_exchange_n(&drain_queued, 1, __ATOMIC_RELAXED)) {
        return;
    }
    int err = errno; /* the pending calls' lock may sleep: see sync.h */
    if (Py_AddPendingCall(drain_pending_call, NULL) != 0) {
        __atomic_store_n(&drain_queued, 0, __ATOMIC_RELAXED);
    }
    errno = err;
}

static inline void
maybe_queue_drain(size_t graveyard_len)
{
    if (HW_UNLIKELY(graveyard_len >= GRAVEYARD_DRAIN_AT)) {
        queue_drain();
    }
}

static int
capture_caller(hw_capture_t *cap, int gil_domain)
{
    int max_nframe = hw_load_int(&hw_tracer.max_nframe);
    int count_depth = hw_counts_depth();
    PyThreadState *tstate = gil_domain ? hw_tstate_unchecked() : hw_tstate_if_gil_held();
    if (HW_UNLIKELY(tstate != NULL && tstate->interp != main_interp)) {
        return hw_capture(cap, NULL, 1, max_nframe, count_depth); /* see main_interp */
    }
    if (gil_domain || tstate != NULL) {
        int rc = hw_capture(cap, tstate, 0, max_nframe, count_depth);
        if (HW_UNLIKELY(__atomic_load_n(&hw_routes_on, __ATOMIC_RELAXED)) && rc == 0 &&
            tstate != NULL && !hw_py_is_finalizing()) {
            cap->route = hw_route_current();
        }
        return rc;
    }
    tstate = PyGILState_GetThisThreadState();
    if (tstate != NULL && tstate->interp != main_interp) {
        tstate = NULL;
    }
    return hw_capture(cap, tstate, 1, max_nframe, count_depth);
}

/* Whether the calling thread runs in the main interpreter (or none). */
static inline int
in_main_interp(void)
{
    PyThreadState *tstate = hw_tstate_unchecked();
    return tstate == NULL || tstate->interp == main_interp;
}

/* Records a block in a domain: 0 for the hooks' blocks, another for those
 * reported through PyTraceMalloc_Track. */
static inline void
record_block_in(uint32_t domain, void *ptr, size_t size, int gil_domain)
{
    uint32_t epoch = __atomic_load_n(&hw_tracer.epoch, __ATOMIC_ACQUIRE);
    hw_capture_t cap;
    if (capture_caller(&cap, gil_domain) < 0) {
        hw_count_dropped();
        return;
    }
    hw_lock();
    if (hw_tracer.tracing && hw_tracer.epoch == epoch) {
        if (domain == 0) {
            hw_record_unlocked((uintptr_t)ptr, size, &cap);
        }
        else {
            hw_add_trace_unlocked(domain, (uintptr_t)ptr, size, &cap);
        }
    }
    size_t dead = hw_graveyard_len_unlocked();
    hw_unlock();
    hw_capture_release(&cap);
    if (!cap.no_code_refs) {
        maybe_queue_drain(dead);
    }
}

static void
record_block(void *ptr, size_t size, int gil_domain)
{
    record_block_in(0, ptr, size, gil_domain);
#if HW_HAVE_REFTRACER
    hw_tls.stamped = ptr;
#endif
}

/* Whether ptr may have a trace, without the lock.  In sample mode a clear
 * filter bit proves it has none; in exact mode only an empty table with no
 * insert queued does.  (A free follows its malloc's return, so it sees what
 * the malloc's hook stored.) */
static inline int
maybe_traced(int state, const void *ptr)
{
    if (state & HW_STATE_SAMPLE) {
        return hw_filter_maybe(ptr);
    }
    return __atomic_load_n(&hw_tracer.ntraces, __ATOMIC_RELAXED) != 0 ||
           __atomic_load_n(&hw_tracer.npending, __ATOMIC_RELAXED) != 0;
}

/* Whether a new block of size bytes is to be recorded.  The sample is drawn
 * for heapwatch's own threads too (the service's blocks keep their
 * probability); their blocks are then not recorded (hw_tls_t.own). */
static inline int
wants_record(int state, hw_tls_t *tls, size_t size, int gil_domain)
{
    if (!(state & HW_STATE_RECORDING)) {
        return 0;
    }
    int take = !(state & HW_STATE_SAMPLE) ||
               (gil_domain ? hw_gil_sample_take(size) : hw_sample_take(tls, size));
    return take && !tls->own;
}

/* pymalloc serves MEM and OBJ requests up to this size itself; larger ones
 * go to PyMem_RawMalloc, i.e. through our RAW hook, nested.  (Its arena table
 * may also grow through PyMem_RawRealloc: a real block, traced on its own.) */
#define HW_NESTING_THRESHOLD 512

/* What a sampled block of 1 to 512 bytes is allocated as in the sampling set:
 * past pymalloc's threshold, pymalloc hands it to PyMem_RawMalloc and later
 * frees it with PyMem_RawFree, keeping its own count of such blocks right. */
#define HW_RAW_BACKED_SIZE (HW_NESTING_THRESHOLD + 1)

/* Whether a sampled MEM or OBJ block of size bytes must be raw-backed:
 * pymalloc would serve it itself, and its free would then pass us by. */
static inline int
raw_backed(size_t size)
{
    return __atomic_load_n(&hooks_set, __ATOMIC_RELAXED) == HOOKS_RAW_BACKED &&
           size - 1 < HW_NESTING_THRESHOLD;
}

#define CALL_ALLOC(a, zeroed, nelem, elsize) \
    ((zeroed) ? (a)->calloc((a)->ctx, (nelem), (elsize)) : (a)->malloc((a)->ctx, (elsize)))

/* Marks the calling thread inside our hooks, so that nested calls pass
 * through: RAW's sampling fast path closes meanwhile (see sampling.h), and
 * MEM's and OBJ's slow paths check the flag before anything else.
 * Returns what hook_leave() restores: a stale value is harmless. */
static inline uint32_t
hook_enter(hw_tls_t *tls)
{
    uint32_t fast = tls->fast;
    tls->fast = 0;
    tls->reentrant = 1;
    return fast;
}

static inline void
hook_leave(hw_tls_t *tls, uint32_t fast)
{
    tls->reentrant = 0;
    tls->fast = fast;
}

static size_t forget_block(void *ptr, int gil_domain);

/* Flattened as the allocation path is: capture and interning inlined. */
__attribute__((flatten)) void
hw_hooks_restamp(void *block)
{
    uint32_t epoch = __atomic_load_n(&hw_tracer.epoch, __ATOMIC_ACQUIRE);
    hw_tls_t *tls = &hw_tls;
    if (tls->own) {
        /* Taken back by one of heapwatch's own threads: heapwatch's object
         * now, as if that thread had allocated it, not the service's. */
        (void)forget_block(block, 1);
        return;
    }
    uint32_t fast = hook_enter(tls); /* a capture may allocate the thread's state */
    hw_capture_t cap;
    if (capture_caller(&cap, 1) < 0) {
        hook_leave(tls, fast);
        return; /* the old stamp stays: better than no trace */
    }
    if (cap.no_code_refs) { /* another interpreter's object: nothing better to stamp */
        hw_capture_release(&cap);
        hook_leave(tls, fast);
        return;
    }
    hw_lock();
    if (hw_tracer.tracing && hw_tracer.epoch == epoch) {
        hw_restamp_unlocked((uintptr_t)block, &cap);
    }
    size_t dead = hw_graveyard_len_unlocked();
    hw_unlock();
    hw_capture_release(&cap);
    hook_leave(tls, fast);
    maybe_queue_drain(dead);
}

void
hw_hooks_track(unsigned int domain, uintptr_t ptr, size_t size)
{
    hw_tls_t *tls = &hw_tls;
    int state = hw_load_int(&hw_tracer.hook_state);
    if (tls->reentrant || !(state & HW_STATE_RECORDING) || ptr == 0) {
        return;
    }
    uint32_t fast = hook_enter(tls);
    /* Sampled from the thread's RAW countdown: the caller may not hold the
     * GIL, and a reported block is sampled like any block. */
    if (wants_record(state, tls, size, 0)) {
        record_block_in(domain, (void *)ptr, size, 0);
    }
    hook_leave(tls, fast);
}

void
hw_hooks_untrack(unsigned int domain, uintptr_t ptr)
{
    int state = hw_load_int(&hw_tracer.hook_state);
    /* Inside a hook (an allocator under ours reporting its blocks) the lock
     * may be ours already. */
    if (hw_tls.reentrant || !(state & HW_STATE_TRACING) || !maybe_traced(state, (void *)ptr)) {
        return;
    }
    hw_lock();
    if (hw_tracer.tracing) {
        (void)hw_remove_trace_unlocked(domain, ptr);
    }
    size_t dead = hw_graveyard_len_unlocked();
    hw_unlock();
    /* Not after exit: the interpreter's thread states may be gone. */
    if (HW_UNLIKELY(dead >= GRAVEYARD_DRAIN_AT) && (state & HW_STATE_RECORDING) &&
        hw_tstate_if_gil_held() != NULL) {
        queue_drain();
    }
}

int
hw_hooks_set_thread_traced(int traced)
{
    int was_traced = !hw_tls.own;
    hw_tls.own = !traced;
    return was_traced;
}

/* Out of line, so that the fast paths of the hooks save no registers;
 * flattened, so that the traced path is one function with every helper
 * inlined but the rare ones (HW_COLD). */
static __attribute__((noinline, flatten)) void *
alloc_maybe_record(const PyMemAllocatorEx *a, hw_tls_t *tls, int zeroed, size_t nelem, size_t elsize,
              int record, int gil_domain)
{
    uint32_t fast = hook_enter(tls);
    void *ptr;
    size_t size = nelem * elsize;
    record = record && !tls->own;
    if (record && gil_domain && raw_backed(size)) {
        ptr = zeroed ? a->calloc(a->ctx, 1, HW_RAW_BACKED_SIZE)
                     : a->malloc(a->ctx, HW_RAW_BACKED_SIZE);
    }
    else {
        ptr = CALL_ALLOC(a, zeroed, nelem, elsize);
    }
    if (ptr != NULL && record) {
        record_block(ptr, size, gil_domain);
    }
    hook_leave(tls, fast);
    return ptr;
}

/* RAW, sample mode, recording, off the fast path: a thread not seeded yet,
 * or not on the fast path since it was published.  Opens it for the
 * thread. */
static __attribute__((noinline)) void *
alloc_sample_slow(const PyMemAllocatorEx *a, hw_tls_t *tls, int zeroed, size_t nelem,
                  size_t elsize)
{
    /* Loaded before hw_sample_take() reads the generation (see sampling.h). */
    uint32_t fast = __atomic_load_n(&hw_sample_gate, __ATOMIC_ACQUIRE);
    /* calloc: the wrapped allocator checks nelem * elsize for overflow and
     * then fails; a wrapped product only skews one sampling decision. */
    size_t size = nelem * elsize;
    int record = hw_sample_take(tls, size); /* seeds this thread if needed */
    if (!(fast & HW_SAMPLE_GATE_CLOSED)) {
        tls->fast = fast;
    }
    if (!record) {
        return CALL_ALLOC(a, zeroed, nelem, elsize);
    }
    return alloc_maybe_record(a, tls, zeroed, nelem, elsize, 1, 0);
}

/* RAW, on the fast path, the countdown (already charged) ran out. */
static __attribute__((noinline)) void *
alloc_sample_point(const PyMemAllocatorEx *a, hw_tls_t *tls, int zeroed, size_t nelem,
                   size_t elsize)
{
    return alloc_maybe_record(a, tls, zeroed, nelem, elsize, hw_sample_slow(tls, 0), 0);
}

/* MEM or OBJ, sample mode, recording, off the fast path: a sample point, or
 * a block larger than pymalloc serves, which nests into PyMem_RawMalloc. */
static __attribute__((noinline)) void *
alloc_gil_sample_slow(const PyMemAllocatorEx *a, hw_tls_t *tls, int zeroed, size_t nelem,
                      size_t elsize)
{
    size_t size = nelem * elsize; /* a wrapped calloc product: as above */
    int record = hw_gil_sample_take(size);
    if (!record && size <= HW_NESTING_THRESHOLD) {
        return CALL_ALLOC(a, zeroed, nelem, elsize);
    }
    return alloc_maybe_record(a, tls, zeroed, nelem, elsize, record, 1);
}

/* sampling: MEM's and OBJ's fast path is compiled in (sampling_hooks, installed for
 * sample mode); without it (exact_hooks) the slow path still samples, only
 * slower.  That fast path passes on the ctx it was called with: our hooks
 * are installed with the wrapped allocator's ctx as their own (install_set)
 * and called with the GIL, never during a swap.  The RAW hook may be called
 * during one without the GIL, so it reads the saved ctx. */
static inline __attribute__((always_inline)) void *
hook_alloc(int d, int gil_domain, int sampling, void *ctx, int zeroed, size_t nelem,
           size_t elsize)
{
    const PyMemAllocatorEx *a = &hw_saved[d];
    if (gil_domain && sampling) {
        /* Sample mode, recording, not a sample point, nothing can nest (see
         * hw_gil_countdown): a tail call, touching nothing thread-local, and
         * no wake-up to poll (HW_WAKE_STRIDE). */
        size_t size = nelem * elsize;
        if (HW_LIKELY(size <= HW_NESTING_THRESHOLD)) {
            int64_t left = hw_gil_countdown_load() - (int64_t)size;
            if (HW_LIKELY(left > 0)) {
                hw_gil_countdown_store(left);
                return zeroed ? a->calloc(ctx, nelem, elsize) : a->malloc(ctx, elsize);
            }
        }
    }
    if (gil_domain) {
        hw_wake_check();
    }
    hw_tls_t *tls = &hw_tls;
    if (!gil_domain && HW_LIKELY(hw_on_fast_path(tls))) {
        /* Sample mode, recording, seeded, not inside a hook (see sampling.h). */
        tls->countdown -= (int64_t)(nelem * elsize);
        if (HW_LIKELY(tls->countdown > 0)) {
            /* Nothing to record and nothing nests below RAW: a tail call
             * without touching the re-entrancy flag. */
            return CALL_ALLOC(a, zeroed, nelem, elsize);
        }
        return alloc_sample_point(a, tls, zeroed, nelem, elsize);
    }
    int state = hw_load_int(&hw_tracer.hook_state);
    if (tls->reentrant || !(state & HW_STATE_RECORDING)) {
        return CALL_ALLOC(a, zeroed, nelem, elsize);
    }
    if (state & HW_STATE_SAMPLE) {
        return gil_domain ? alloc_gil_sample_slow(a, tls, zeroed, nelem, elsize)
                          : alloc_sample_slow(a, tls, zeroed, nelem, elsize);
    }
    return alloc_maybe_record(a, tls, zeroed, nelem, elsize, 1, gil_domain);
}

static void *
realloc_traced(const PyMemAllocatorEx *a, void *ptr, size_t size, int was_traced, int record,
               int gil_domain)
{
    uint32_t epoch = __atomic_load_n(&hw_tracer.epoch, __ATOMIC_ACQUIRE);
    hw_capture_t cap;
    int captured = 0;
    if (record) {
        if (capture_caller(&cap, gil_domain) == 0) {
            captured = 1;
        }
        else {
            hw_count_dropped();
        }
    }
    hw_lock();
    /* The lock is held across the realloc: once realloc frees the old
     * address, another thread may get it back, and must not trace it before
     * the old trace is gone.  Nothing the wrapped allocator calls comes back
     * to this lock: nested PyMem calls pass through (tls->reentrant). */
    void *ptr2 = a->realloc(a->ctx, ptr, size);
    if (ptr2 != NULL && captured && gil_domain && raw_backed(size)) {
        /* Recorded, the block must be raw-backed: moved there.  (Nested
         * calls pass through: the caller set the re-entrancy flag.) */
        void *moved = a->malloc(a->ctx, HW_RAW_BACKED_SIZE);
        if (moved != NULL) {
            memcpy(moved, ptr2, size);
            a->free(a->ctx, ptr2);
            ptr2 = moved;
        }
        else {
            hw_capture_release(&cap);
            captured = 0; /* untraced rather than traced where frees pass us by */
            hw_count_dropped();
        }
    }
    if (ptr2 != NULL && hw_tracer.tracing) {
        int add = captured && hw_tracer.epoch == epoch;
        /* Resized in place: adding replaces the old trace in one probe. */
        if (was_traced && !(add && ptr2 == ptr)) {
            hw_forget_unlocked((uintptr_t)ptr);
        }
        if (add) {
            hw_record_unlocked((uintptr_t)ptr2, size, &cap);
#if HW_HAVE_REFTRACER
            hw_tls.stamped = ptr2; /* _PyTuple_Resize reports the object again */
#endif
        }
    }
    size_t dead = hw_graveyard_len_unlocked();
    hw_unlock();
    if (captured) {
        hw_capture_release(&cap);
        if (!cap.no_code_refs) {
            maybe_queue_drain(dead);
        }
    }
    return ptr2;
}

/* A MEM or OBJ realloc that records nothing and forgets nothing: the old
 * block was not sampled and the countdown (already charged) did not run
 * out. */
static __attribute__((noinline)) void *
realloc_unsampled(const PyMemAllocatorEx *a, void *ctx, void *ptr, size_t size)
{
    hw_tls_t *tls = &hw_tls;
    uint32_t fast = hook_enter(tls); /* pymalloc may hand the block to PyMem_RawRealloc */
    void *ptr2 = a->realloc(ctx, ptr, size);
    hook_leave(tls, fast);
    return ptr2;
}

static __attribute__((noinline)) void *
hook_realloc_slow(const PyMemAllocatorEx *a, hw_tls_t *tls, int gil_domain, void *ptr,
                  size_t size)
{
    int state = hw_load_int(&hw_tracer.hook_state);
    if (tls->reentrant || !(state & HW_STATE_TRACING)) {
        return a->realloc(a->ctx, ptr, size);
    }
    uint32_t fast = hook_enter(tls);
    int was_traced = ptr != NULL && maybe_traced(state, ptr);
    int record = wants_record(state, tls, size, gil_domain);
    void *ptr2;
    if (!was_traced && !record) {
        ptr2 = a->realloc(a->ctx, ptr, size);
    }
    else {
        ptr2 = realloc_traced(a, ptr, size, was_traced, record, gil_domain);
    }
    hook_leave(tls, fast);
    return ptr2;
}

static inline __attribute__((always_inline)) void *
hook_realloc(int d, int gil_domain, int sampling, void *ctx, void *ptr, size_t size)
{
    const PyMemAllocatorEx *a = &hw_saved[d];
    if (gil_domain) {
        int64_t left = sampling ? hw_gil_countdown_load() : 0;
        if (HW_LIKELY(left > 0 && size < (uint64_t)left) &&
            HW_LIKELY(ptr == NULL || !hw_filter_maybe(ptr))) {
            hw_gil_countdown_store(left - (int64_t)size);
            if (ptr == NULL && size <= HW_NESTING_THRESHOLD) {
                /* A malloc that pymalloc serves itself: nothing nests. */
                return a->realloc(ctx, ptr, size);
            }
            return realloc_unsampled(a, ctx, ptr, size);
        }
        hw_wake_check();
        return hook_realloc_slow(a, &hw_tls, 1, ptr, size);
    }
    hw_tls_t *tls = &hw_tls;
    if (HW_LIKELY(hw_on_fast_path(tls)) &&
        HW_LIKELY(tls->countdown > 0 && size < (uint64_t)tls->countdown) &&
        HW_LIKELY(ptr == NULL || !hw_filter_maybe(ptr))) {
        tls->countdown -= (int64_t)size;
        return a->realloc(a->ctx, ptr, size);
    }
    return hook_realloc_slow(a, tls, 0, ptr, size);
}

/* Returns the size of the trace removed at once, or SIZE_MAX. */
static size_t
forget_block(void *ptr, int gil_domain)
{
    /* Untrack before freeing: once freed, the address may be reused and
     * traced by another thread. */
    size_t size = SIZE_MAX;
    hw_lock();
    if (hw_tracer.tracing) {
        size = hw_forget_unlocked((uintptr_t)ptr);
    }
    size_t dead = hw_graveyard_len_unlocked();
    hw_unlock();
    if (gil_domain && in_main_interp()) {
        maybe_queue_drain(dead);
    }
    return size;
}

static __attribute__((noinline, flatten)) void
free_traced(const PyMemAllocatorEx *a, hw_tls_t *tls, void *ptr, int gil_domain)
{
    size_t size = forget_block(ptr, gil_domain);
    if (!gil_domain || size <= HW_NESTING_THRESHOLD) {
        /* Nothing nests: libc frees by itself, and pymalloc hands only its
         * large blocks to PyMem_RawFree.  (Were it to, the nested free would
         * find no trace left: the flag only spares it the lookup.) */
        a->free(a->ctx, ptr);
        return;
    }
    uint32_t fast = hook_enter(tls);
    a->free(a->ctx, ptr);
    hook_leave(tls, fast);
}

static inline __attribute__((always_inline)) void
hook_free(int d, int gil_domain, void *ptr)
{
    const PyMemAllocatorEx *a = &hw_saved[d];
    if (HW_LIKELY(hw_sampling_open())) {
        /* Sample mode: a clear filter bit proves the block untraced, for
         * whoever frees it, nested in our hooks or not; no thread state to
         * read.  A set bit (or NULL's, rarely) takes the way below. */
        if (HW_LIKELY(!hw_filter_maybe(ptr))) {
            a->free(a->ctx, ptr);
            return;
        }
    }
    hw_tls_t *tls = &hw_tls;
    int state = hw_load_int(&hw_tracer.hook_state);
    if (tls->reentrant || !(state & HW_STATE_TRACING) || ptr == NULL ||
        !maybe_traced(state, ptr)) {
        /* A nested free of the same block (pymalloc handing a large one to
         * PyMem_RawFree) finds the same answer: no flag needed, tail call. */
        a->free(a->ctx, ptr);
        return;
    }
    free_traced(a, tls, ptr, gil_domain);
}

#define DEFINE_ALLOC_HOOKS(NAME, D, GIL, SAMPLING)                                   \
    static void *NAME##_malloc(void *ctx, size_t size)                               \
    {                                                                                \
        return hook_alloc(D, GIL, SAMPLING, ctx, 0, 1, size);                        \
    }                                                                                \
    static void *NAME##_calloc(void *ctx, size_t nelem, size_t elsize)               \
    {                                                                                \
        return hook_alloc(D, GIL, SAMPLING, ctx, 1, nelem, elsize);                  \
    }                                                                                \
    static void *NAME##_realloc(void *ctx, void *ptr, size_t size)                   \
    {                                                                                \
        return hook_realloc(D, GIL, SAMPLING, ctx, ptr, size);                       \
    }

#define DEFINE_FREE_HOOK(NAME, D, GIL)                                               \
    static void NAME##_free(void *ctx, void *ptr)                                    \
    {                                                                                \
        (void)ctx;                                                                   \
        hook_free(D, GIL, ptr);                                                      \
    }

DEFINE_ALLOC_HOOKS(raw, D_RAW, 0, 1)
DEFINE_ALLOC_HOOKS(mem, D_MEM, 1, 1)
DEFINE_ALLOC_HOOKS(obj, D_OBJ, 1, 1)
DEFINE_ALLOC_HOOKS(mem_exact, D_MEM, 1, 0)
DEFINE_ALLOC_HOOKS(obj_exact, D_OBJ, 1, 0)
DEFINE_FREE_HOOK(raw, D_RAW, 0)
DEFINE_FREE_HOOK(mem, D_MEM, 1)
DEFINE_FREE_HOOK(obj, D_OBJ, 1)

/* Our hooks in sample mode: MEM's and OBJ's with their sampling fast path. */
static const PyMemAllocatorEx sampling_hooks[D_COUNT] = {
    {NULL, raw_malloc, raw_calloc, raw_realloc, raw_free},
    {NULL, mem_malloc, mem_calloc, mem_realloc, mem_free},
    {NULL, obj_malloc, obj_calloc, obj_realloc, obj_free},
};

/* MEM's and OBJ's in exact mode, without it: every call goes where the
 * fast path would send it in exact mode, a few instructions sooner. */
static const PyMemAllocatorEx exact_hooks[D_COUNT] = {
    {NULL, raw_malloc, raw_calloc, raw_realloc, raw_free},
    {NULL, mem_exact_malloc, mem_exact_calloc, mem_exact_realloc, mem_free},
    {NULL, obj_exact_malloc, obj_exact_calloc, obj_exact_realloc, obj_free},
};

/* 1 if the stdlib tracer is tracing, 0 if not, -1 with an exception set. */
static int
stdlib_tracer_running(void)
{
    PyObject *mod = PyImport_ImportModule("_tracemalloc");
    if (mod == NULL) {
        PyErr_Clear(); /* a build without it cannot be tracing */
        return 0;
    }
    PyObject *res = PyObject_CallMethod(mod, "is_tracing", NULL);
    Py_DECREF(mod);
    if (res == NULL) {
        return -1;
    }
    int running = PyObject_IsTrue(res);
    Py_DECREF(res);
    return running;
}

/* Puts an allocator at the top of a domain's chain, with the ctx already
 * there (install_set and hw_hooks_install keep it).  PyMem_SetAllocator
 * copies the struct as it likes, and Debian's 3.15 copies it 4 bytes at a
 * time (rep movsl): a thread calling PyMem_RawMalloc without the GIL
 * meanwhile read half our hook's address and half the old allocator's, and
 * jumped there.  Where the struct can be reached (3.13+), each function
 * pointer is stored whole instead, so that a racing call finds the old
 * function or ours, either valid with that ctx. */
static void
set_allocator(PyMemAllocatorDomain domain, const PyMemAllocatorEx *allocator)
{
    PyMemAllocatorEx *live = hw_domain_allocator(domain);
    if (live == NULL || live->ctx != allocator->ctx) {
        PyMem_SetAllocator(domain, (PyMemAllocatorEx *)allocator);
        return;
    }
    hw_allocators_lock();
    __atomic_store_n(&live->malloc, allocator->malloc, __ATOMIC_RELEASE);
    __atomic_store_n(&live->calloc, allocator->calloc, __ATOMIC_RELEASE);
    __atomic_store_n(&live->realloc, allocator->realloc, __ATOMIC_RELEASE);
    __atomic_store_n(&live->free, allocator->free, __ATOMIC_RELEASE);
    hw_allocators_unlock();
}

/* Installs the hooks for MEM and OBJ: in exact mode exact_hooks; in sample
 * mode sampling_hooks, and above plain pymalloc the sampling set: those but for free,
 * which is pymalloc's own.  Sampling above plain pymalloc, every traced MEM
 * or OBJ block is raw-backed (raw_backed), so pymalloc frees it through our
 * RAW hook, and the free of every other block, the most frequent call there
 * is, goes to pymalloc untouched: a hook that did nothing but forward cost
 * the deep_stack workload 4 to 5%.  Called with the GIL while nothing is
 * traced, so no traced block changes hands. */
static void
install_set(int sampling)
{
    int set = !sampling ? HOOKS_EXACT : pymalloc_below ? HOOKS_RAW_BACKED : HOOKS_SAMPLING;
    for (int d = D_MEM; d < D_COUNT; d++) {
        PyMemAllocatorEx hook = sampling ? sampling_hooks[d] : exact_hooks[d];
        /* Called with it, MEM's and OBJ's fast path passes it on. */
        hook.ctx = hw_saved[d].ctx;
        if (set == HOOKS_RAW_BACKED) {
            hook.free = hw_saved[d].free;
        }
        set_allocator(py_domains[d], &hook);
    }
    __atomic_store_n(&hooks_set, set, __ATOMIC_RELAXED);
}

/* Whether the set in the chain is ours, with MEM's and OBJ's sampling fast
 * path, rather than exact_hooks. */
static int
sampling_set_in(void)
{
    return hooks_set >= HOOKS_SAMPLING;
}

/* Whether our MEM and OBJ hooks are the top of their chains. */
static int
on_top(void)
{
    for (int d = D_MEM; d < D_COUNT; d++) {
        PyMemAllocatorEx current;
        PyMem_GetAllocator(py_domains[d], &current);
        if (current.malloc != (sampling_set_in() ? sampling_hooks : exact_hooks)[d].malloc) {
            return 0;
        }
    }
    return 1;
}

int
hw_hooks_install(int sampling)
{
    if (hooks_set != HOOKS_NONE) {
        if (sampling == sampling_set_in()) {
            return 0;
        }
        if (on_top()) {
            install_set(sampling);
            return 0;
        }
        /* Buried: exact_hooks sample just as well (without the fast path),
         * sampling_hooks with our free trace exactly just as well; only the sampling
         * set cannot. */
        if (sampling || hooks_set != HOOKS_RAW_BACKED) {
            return 0;
        }
        PyErr_SetString(PyExc_RuntimeError,
                        "heapwatch's sampling hooks are buried under another tracer's (the "
                        "stdlib tracemalloc module, say), and they do not see pymalloc's frees: "
                        "heapwatch cannot trace exactly from there; stop that tracer first, or "
                        "trace in sample mode");
        return -1;
    }
    int running = stdlib_tracer_running();
    if (running < 0) {
        return -1;
    }
    if (running) {
        PyErr_SetString(PyExc_RuntimeError,
                        "the stdlib tracemalloc module is tracing: heapwatch cannot install its "
                        "allocator hooks under it, because tracemalloc.stop() would then remove "
                        "them; call tracemalloc.stop() first, or start heapwatch before tracemalloc");
        return -1;
    }
    const char *below = _PyMem_GetCurrentAllocatorName();
    pymalloc_below = below != NULL && strcmp(below, "pymalloc") == 0;
    for (int d = 0; d < D_COUNT; d++) {
        PyMem_GetAllocator(py_domains[d], &hw_saved[d]);
    }
    /* Publish hw_saved before any thread can enter a hook. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    PyMemAllocatorEx raw = sampling_hooks[D_RAW];
    raw.ctx = hw_saved[D_RAW].ctx;
    set_allocator(py_domains[D_RAW], &raw);
    install_set(sampling);
    return 0;
}

void
hw_hooks_uninstall(void)
{
    if (hooks_set == HOOKS_NONE) {
        return;
    }
    PyMemAllocatorEx raw;
    PyMem_GetAllocator(py_domains[D_RAW], &raw);
    if (raw.malloc != sampling_hooks[D_RAW].malloc || !on_top()) {
        return; /* buried under another hook: stay, passing through */
    }
    for (int d = 0; d < D_COUNT; d++) {
        set_allocator(py_domains[d], &hw_saved[d]);
    }
    __atomic_store_n(&hooks_set, HOOKS_NONE, __ATOMIC_RELAXED);
}

int
hw_hooks_installed(void)
{
    return hooks_set != HOOKS_NONE;
}

/* pthread_atfork handlers: fork() happens with hw_tables_lock held by the
 * forking thread, so the child's tables are consistent.  The forking thread
 * passes through its own hooks meanwhile (other atfork handlers may
 * allocate), and never waits on the lock it holds. */
static void
fork_prepare(void)
{
    fork_saved_reentrant = hw_tls.reentrant;
    hw_tls.fast = 0;
    hw_tls.reentrant = 1;
    hw_lock();
}

static void
fork_parent(void)
{
    hw_unlock();
    hw_tls.reentrant = fork_saved_reentrant;
}

static void
fork_child(void)
{
    hw_thread_fork_child_unlocked();
    hw_unlock();
    __atomic_store_n(&drain_queued, 0, __ATOMIC_RELAXED);
    /* Parent and child must not draw the same sample points. */
    hw_sampling_reseed_all();
    hw_sampling_reset_this_thread();
    hw_tls.reentrant = fork_saved_reentrant;
}

int
hw_hooks_init_once(void)
{
    if (fork_handlers_registered) {
        return 0;
    }
    int err = pthread_atfork(fork_prepare, fork_parent, fork_child);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    fork_handlers_registered = 1;
    main_interp = PyInterpreterState_Main();
    return hw_thread_init_once();
}
