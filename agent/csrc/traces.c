#include "traces.h"

#include <string.h>

#include "mem.h"

#define MIN_CAPACITY 1024u

/* Guarded by hw_tables_lock: the current epoch, and the same in place in an
 * address word. */
static uint32_t epoch_now;
static uintptr_t epoch_bits;

static inline size_t
home(const hw_traces_t *t, uintptr_t ptr)
{
    return (size_t)(((uint64_t)ptr * UINT64_C(0x9E3779B97F4A7C15)) >> t->shift);
}

static int
log2_of(size_t capacity)
{
    int bits = 0;
    while (((size_t)1 << bits) < capacity) {
        bits++;
    }
    return bits;
}

static int
alloc_slots(hw_traces_t *t, size_t capacity)
{
    /* Big tables are probed at random addresses: huge pages spare a TLB
     * miss on most probes (tables of a million traces are 32 MiB). */
    hw_slot_t *slots = hw_calloc_huge(HW_MEM_TRACER, capacity, sizeof(hw_slot_t));
    if (slots == NULL) {
        return -1;
    }
    t->slots = slots;
    t->mask = capacity - 1;
    t->shift = 64 - log2_of(capacity);
    return 0;
}

int
hw_traces_init(hw_traces_t *t)
{
    memset(t, 0, sizeof(*t));
    return alloc_slots(t, MIN_CAPACITY);
}

void
hw_traces_fini(hw_traces_t *t)
{
    if (t->big != NULL) {
        hw_traces_fini(t->big);
        hw_free(HW_MEM_TRACER, t->big);
    }
    hw_free(HW_MEM_TRACER, t->slots);
    memset(t, 0, sizeof(*t));
}

size_t
hw_traces_footprint(const hw_traces_t *t)
{
    size_t bytes = t->slots != NULL ? (t->mask + 1) * sizeof(hw_slot_t) : 0;
    if (t->big != NULL) {
        bytes += sizeof(*t->big) + hw_traces_footprint(t->big);
    }
    return bytes;
}

/* Slot index of ptr (at most 48 bits), or of the empty slot where it would go. */
static inline size_t
probe(const hw_traces_t *t, uintptr_t ptr)
{
    size_t i = home(t, ptr);
    while (t->slots[i].ptr != 0 && hw_slot_ptr(&t->slots[i]) != ptr) {
        i = (i + 1) & t->mask;
    }
    return i;
}

/* Whether slot i holds ptr's trace. */
static inline int
holds(const hw_traces_t *t, size_t i, uintptr_t ptr)
{
    return t->slots[i].ptr != 0 && hw_slot_ptr(&t->slots[i]) == ptr;
}

static __attribute__((noinline)) int
rehash(hw_traces_t *t, size_t capacity)
{
    hw_traces_t fresh = *t;
    if (alloc_slots(&fresh, capacity) < 0) {
        return -1;
    }
    /* Each move lands at a random slot of a table that may be far bigger
     * than the caches: prefetching a dozen moves ahead overlaps the misses. */
    const size_t ahead = 16;
    size_t n = t->mask + 1;
    for (size_t i = 0; i < n; i++) {
        if (i + ahead < n && t->slots[i + ahead].ptr != 0) {
            __builtin_prefetch(&fresh.slots[home(&fresh, hw_slot_ptr(&t->slots[i + ahead]))], 1);
        }
        if (t->slots[i].ptr != 0) {
            fresh.slots[probe(&fresh, hw_slot_ptr(&t->slots[i]))] = t->slots[i];
        }
    }
    hw_free(HW_MEM_TRACER, t->slots);
    *t = fresh;
    return 0;
}

/* Put a raw slot value; returns 0 insert, 1 replace (*old = previous slot), -1 OOM.
 * One probe, but after growing the table. */
static inline int
put_slot(hw_traces_t *t, uintptr_t ptr, uint32_t tb, uint32_t size, hw_slot_t *old)
{
    size_t i = probe(t, ptr);
    if (t->slots[i].ptr != 0) {
        /* ptr's trace: replaced by a new one, of this epoch */
        *old = t->slots[i];
        t->slots[i].ptr = ptr | epoch_bits;
        t->slots[i].tb = tb;
        t->slots[i].size = size;
        return 1;
    }
    /* Keep the load factor at 3/4 at most. */
    if ((t->count + 1) * 4 > (t->mask + 1) * 3) {
        if (rehash(t, (t->mask + 1) * 2) < 0) {
            return -1;
        }
        i = probe(t, ptr);
    }
    t->slots[i].ptr = ptr | epoch_bits;
    t->slots[i].tb = tb;
    t->slots[i].size = size;
    t->count++;
    return 0;
}

static void
delete_at(hw_traces_t *t, size_t i)
{
    /* Backward shift: move later members of the probe run into the hole
     * unless their home lies cyclically in (hole, j]. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->slots[j].ptr == 0) {
            break;
        }
        size_t k = home(t, hw_slot_ptr(&t->slots[j]));
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].ptr = 0;
    t->count--;
    /* Shrink only far below a peak: a live set that swings up and down (a
     * request, a json round trip) would otherwise rehash on every swing.
     * hw_traces_compact_unlocked() brings the table closer to live traces at
     * every snapshot and drain.  A failure to shrink only costs memory. */
    size_t capacity = t->mask + 1;
    if (capacity > MIN_CAPACITY && t->count * 64 < capacity) {
        (void)rehash(t, capacity / 4);
    }
}

void
hw_traces_compact_unlocked(hw_traces_t *t)
{
    size_t capacity = t->mask + 1;
    size_t target = capacity;
    while (target > MIN_CAPACITY && t->count * 8 < target) {
        target /= 2;
    }
    if (target < capacity) {
        (void)rehash(t, target);
    }
    if (t->big != NULL) {
        hw_traces_compact_unlocked(t->big);
    }
}

static int
pop_slot(hw_traces_t *t, uintptr_t ptr, hw_slot_t *out)
{
    if (__builtin_expect(ptr > HW_PTR_MASK, 0)) {
        return 0; /* never traced */
    }
    size_t i = probe(t, ptr);
    if (t->slots[i].ptr == 0) {
        return 0;
    }
    *out = t->slots[i];
    delete_at(t, i);
    return 1;
}

static __attribute__((noinline, cold)) size_t
big_size(const hw_traces_t *t, uintptr_t ptr)
{
    if (t->big != NULL) {
        size_t i = probe(t->big, ptr);
        if (holds(t->big, i, ptr)) {
            return (size_t)t->big->slots[i].tb | ((size_t)t->big->slots[i].size << 32);
        }
    }
    return HW_SIZE_BIG; /* unreachable when the tables are consistent */
}

size_t
hw_traces_slot_size_unlocked(const hw_traces_t *t, const hw_slot_t *slot)
{
    return slot->size == HW_SIZE_BIG ? big_size(t, hw_slot_ptr(slot)) : slot->size;
}

uint32_t
hw_traces_slot_age_unlocked(const hw_slot_t *slot)
{
    uint32_t age = (uint16_t)(epoch_now - (uint32_t)(slot->ptr >> HW_PTR_BITS));
    return age < HW_MAX_AGE ? age : HW_MAX_AGE;
}

uint32_t
hw_traces_epoch_unlocked(void)
{
    return epoch_now;
}

void
hw_traces_reset_epoch_unlocked(void)
{
    epoch_now = 0;
    epoch_bits = 0;
}

/* Saturates the ages of a table's traces at HW_MAX_AGE, as of epoch. */
static void
saturate_ages(hw_traces_t *t, uint32_t epoch)
{
    for (size_t i = 0; i <= t->mask; i++) {
        hw_slot_t *slot = &t->slots[i];
        if (slot->ptr == 0) {
            continue;
        }
        /* Exact: every age is below 2**16 as of epoch_now. */
        uint64_t age = (uint16_t)(epoch_now - (uint32_t)(slot->ptr >> HW_PTR_BITS)) +
                       (uint64_t)(epoch - epoch_now);
        if (age > HW_MAX_AGE) {
            age = HW_MAX_AGE;
        }
        uintptr_t stamp = (uint16_t)(epoch - (uint32_t)age);
        slot->ptr = hw_slot_ptr(slot) | (stamp << HW_PTR_BITS);
    }
}

void
hw_traces_set_epoch_unlocked(uint32_t epoch, hw_traces_t *const *tables, size_t n)
{
    /* Within one block of HW_MAX_AGE epochs, ages stay below 2 * HW_MAX_AGE
     * = 2**16 from one pass to the next. */
    if (epoch - epoch_now >= HW_MAX_AGE || epoch / HW_MAX_AGE != epoch_now / HW_MAX_AGE) {
        for (size_t k = 0; k < n; k++) {
            saturate_ages(tables[k], epoch);
        }
    }
    epoch_now = epoch;
    epoch_bits = (uintptr_t)(uint16_t)epoch << HW_PTR_BITS;
}

static __attribute__((noinline, cold)) void
drop_big(hw_traces_t *t, uintptr_t ptr)
{
    hw_slot_t unused;
    if (t->big != NULL) {
        (void)pop_slot(t->big, ptr, &unused);
    }
}

static int
set_big(hw_traces_t *t, uintptr_t ptr, size_t size)
{
    hw_slot_t unused;
    if (t->big == NULL) {
        hw_traces_t *big = hw_malloc(HW_MEM_TRACER, sizeof(*big));
        if (big == NULL) {
            return -1;
        }
        if (hw_traces_init(big) < 0) {
            hw_free(HW_MEM_TRACER, big);
            return -1;
        }
        t->big = big;
    }
    return put_slot(t->big, ptr, (uint32_t)size, (uint32_t)((uint64_t)size >> 32), &unused) < 0
               ? -1 : 0;
}

/* A trace of 4 GiB or more: its size goes to the side table. */
static __attribute__((noinline, cold)) int
put_big(hw_traces_t *t, uintptr_t ptr, uint32_t tb, size_t size, hw_trace_t *old)
{
    size_t i = probe(t, ptr);
    if (holds(t, i, ptr)) {
        /* Replace: the slot exists, so only the side table can fail. */
        size_t old_size = hw_traces_slot_size_unlocked(t, &t->slots[i]);
        if (set_big(t, ptr, size) < 0) {
            return -1;
        }
        old->ptr = ptr;
        old->tb = t->slots[i].tb;
        old->size = old_size;
        t->slots[i].ptr = ptr | epoch_bits;
        t->slots[i].tb = tb;
        t->slots[i].size = HW_SIZE_BIG;
        return 1;
    }
    if (set_big(t, ptr, size) < 0) {
        return -1;
    }
    hw_slot_t unused;
    if (put_slot(t, ptr, tb, HW_SIZE_BIG, &unused) < 0) {
        drop_big(t, ptr);
        return -1;
    }
    return 0;
}

int
hw_traces_put_unlocked(hw_traces_t *t, uintptr_t ptr, uint32_t tb, size_t size, hw_trace_t *old)
{
    if (__builtin_expect(ptr > HW_PTR_MASK, 0)) {
        return -1; /* no room for the epoch: dropped */
    }
    if (__builtin_expect(size >= HW_SIZE_BIG, 0)) {
        return put_big(t, ptr, tb, size, old);
    }
    hw_slot_t prev;
    int res = put_slot(t, ptr, tb, (uint32_t)size, &prev);
    if (__builtin_expect(res != 1, 1)) {
        return res;
    }
    old->ptr = ptr;
    old->tb = prev.tb;
    if (__builtin_expect(prev.size == HW_SIZE_BIG, 0)) {
        old->size = big_size(t, ptr); /* the side table still has it */
        drop_big(t, ptr);
    }
    else {
        old->size = prev.size;
    }
    return 1;
}

int
hw_traces_pop_unlocked(hw_traces_t *t, uintptr_t ptr, hw_trace_t *out)
{
    hw_slot_t slot;
    if (!pop_slot(t, ptr, &slot)) {
        return 0;
    }
    out->ptr = ptr;
    out->tb = slot.tb;
    if (slot.size == HW_SIZE_BIG) {
        out->size = big_size(t, ptr);
        drop_big(t, ptr);
    }
    else {
        out->size = slot.size;
    }
    return 1;
}

/* The slot of ptr, with its trace in *out; NULL if ptr is not traced. */
static hw_slot_t *
find(const hw_traces_t *t, uintptr_t ptr, hw_trace_t *out)
{
    if (__builtin_expect(ptr > HW_PTR_MASK, 0)) {
        return NULL;
    }
    size_t i = probe(t, ptr);
    if (t->slots[i].ptr == 0) {
        return NULL;
    }
    out->ptr = ptr;
    out->tb = t->slots[i].tb;
    out->size = hw_traces_slot_size_unlocked(t, &t->slots[i]);
    return &t->slots[i];
}

int
hw_traces_retag_unlocked(hw_traces_t *t, uintptr_t ptr, uint32_t tb, hw_trace_t *old)
{
    hw_slot_t *slot = find(t, ptr, old);
    if (slot == NULL) {
        return 0;
    }
    /* A block handed back by a free list is a new object: of this epoch. */
    slot->ptr = ptr | epoch_bits;
    slot->tb = tb;
    return 1;
}

int
hw_traces_get_unlocked(const hw_traces_t *t, uintptr_t ptr, hw_trace_t *out)
{
    return find(t, ptr, out) != NULL;
}
