/* The table of live traces of one domain: block address -> (traceback id, size).
 *
 * Open addressing with linear probing and backward-shift deletion, so that
 * heavy churn leaves no tombstones behind and probes stay short.  A slot is 16
 * bytes (address, traceback id, size as 32 bits): memory per live block is what
 * the issue budgets (48 bytes at most), so sizes of 4 GiB and more are marked
 * HW_SIZE_BIG and kept in a small side table that real workloads rarely touch.
 *
 * The age of a trace (the epoch it was allocated in, _core.set_epoch()) takes
 * no room of its own: user-space addresses fit in 48 bits (x86-64 with 4-level
 * page tables, AArch64 without pointer tags), so the address word keeps the
 * epoch modulo 2**16 in its high 16 bits.  A block whose address does not fit
 * is not traced (counted as dropped).  hw_traces_set_epoch_unlocked() keeps
 * every age below 2**16 epochs, so the 16 bits never wrap onto a younger age:
 * when the epoch crosses a multiple of HW_MAX_AGE (or jumps by as much), one
 * pass over the tables saturates the ages at HW_MAX_AGE.
 *
 * Every function that takes a table expects hw_tables_lock to be held.
 */
#ifndef HEAPWATCH_TRACES_H
#define HEAPWATCH_TRACES_H

#include <stddef.h>
#include <stdint.h>

#define HW_SIZE_BIG UINT32_MAX
#define HW_PTR_BITS 48
#define HW_PTR_MASK (((uintptr_t)1 << HW_PTR_BITS) - 1)
/* Ages are reported up to this many epochs; older ones as this. */
#define HW_MAX_AGE 32768u

typedef struct {
    uintptr_t ptr; /* address | epoch << HW_PTR_BITS; 0 marks an empty slot */
    uint32_t tb;   /* id of an interned traceback */
    uint32_t size; /* HW_SIZE_BIG: the size is in the side table */
} hw_slot_t;

typedef struct hw_traces {
    hw_slot_t *slots;
    size_t mask;  /* capacity - 1, capacity a power of two */
    int shift;    /* 64 - log2(capacity), for Fibonacci hashing */
    size_t count;
    struct hw_traces *big; /* address -> size as (tb = low, size = high) halves */
} hw_traces_t;

typedef struct {
    uintptr_t ptr;
    uint32_t tb;
    uint16_t epoch; /* modulo 2**16 */
    size_t size;
} hw_trace_t;

static inline uintptr_t
hw_slot_ptr(const hw_slot_t *slot)
{
    return slot->ptr & HW_PTR_MASK;
}

/* The age in epochs of a slot's trace, at most HW_MAX_AGE. */
uint32_t hw_traces_slot_age_unlocked(const hw_slot_t *slot);

/* Starts loading the cache line where ptr's slot lives, without the lock:
 * the hooks call it before walking frames, so the table's cache miss
 * overlaps that work.  The racy reads are harmless: a prefetch of a stale
 * address never faults and only wastes a load. */
static inline void
hw_traces_prefetch(const hw_traces_t *t, uintptr_t ptr)
{
    hw_slot_t *slots = __atomic_load_n((hw_slot_t *const *)&t->slots, __ATOMIC_RELAXED);
    int shift = __atomic_load_n(&t->shift, __ATOMIC_RELAXED);
    if (slots != NULL && shift > 0 && shift < 64) {
        __builtin_prefetch(&slots[((uint64_t)ptr * UINT64_C(0x9E3779B97F4A7C15)) >> shift], 1);
    }
}

/* Returns 0, or -1 when out of memory. */
int hw_traces_init(hw_traces_t *t);
void hw_traces_fini(hw_traces_t *t);
/* Bytes held by the table itself (capacity, not count). */
size_t hw_traces_footprint(const hw_traces_t *t);

/* Insert, or replace an existing trace of ptr.  Returns 0 on insert, 1 on
 * replace (*old gets the previous trace), -1 when out of memory (table
 * unchanged). */
int hw_traces_put_unlocked(hw_traces_t *t, uintptr_t ptr, uint32_t tb, size_t size,
                           hw_trace_t *old);
/* Remove the trace of ptr.  Returns 1 and fills *out if there was one. */
int hw_traces_pop_unlocked(hw_traces_t *t, uintptr_t ptr, hw_trace_t *out);
/* Gives the trace of ptr, if any, the traceback tb in one probe.  Returns 1
 * and fills *old with the trace as it was, or 0 if ptr is not traced. */
int hw_traces_retag_unlocked(hw_traces_t *t, uintptr_t ptr, uint32_t tb, hw_trace_t *old);
/* Returns 1 and fills *out if ptr is traced. */
int hw_traces_get_unlocked(const hw_traces_t *t, uintptr_t ptr, hw_trace_t *out);
/* Halves the table while live traces fill less than 1/8 of it (deletes
 * shrink it only below 1/64, so that swings of the live set do not rehash). */
void hw_traces_compact_unlocked(hw_traces_t *t);
/* Full size of an occupied slot. */
size_t hw_traces_slot_size_unlocked(const hw_traces_t *t, const hw_slot_t *slot);
/* The epoch new and replaced traces get; the tables are the domain tables
 * (n of them), whose ages are saturated if the move needs it (see above). */
void hw_traces_set_epoch_unlocked(uint32_t epoch, hw_traces_t *const *tables, size_t n);
uint32_t hw_traces_epoch_unlocked(void);
/* Back to epoch 0, when no trace is left (stop). */
void hw_traces_reset_epoch_unlocked(void);

#endif
