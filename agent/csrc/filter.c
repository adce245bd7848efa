#include "filter.h"

#include "mem.h"

/* Bits: atomic or/and under hw_tables_lock, atomic loads without it. */
uint64_t hw_sample_bits[(1u << HW_FILTER_BITS) / 64];
/* Live sampled blocks per bucket; hw_tables_lock.  Allocated on first use. */
static uint32_t *bucket_counts;
/* Whether any bit may be set; hw_tables_lock. */
static int filter_dirty;

__attribute__((noinline)) void
hw_filter_add_unlocked(uintptr_t ptr, int delta)
{
    size_t slot = hw_filter_slot(ptr);
    uint64_t bit = (uint64_t)1 << (slot % 64);
    if (bucket_counts == NULL) {
        bucket_counts = hw_calloc(HW_MEM_TRACER, (size_t)1 << HW_FILTER_BITS, sizeof(uint32_t));
        if (bucket_counts == NULL) {
            /* Without counts a bit can never be cleared again: only costs
             * frees a table lookup, never correctness. */
            if (delta > 0) {
                __atomic_fetch_or(&hw_sample_bits[slot / 64], bit, __ATOMIC_RELAXED);
                filter_dirty = 1;
            }
            return;
        }
    }
    if (delta > 0) {
        if (bucket_counts[slot]++ == 0) {
            __atomic_fetch_or(&hw_sample_bits[slot / 64], bit, __ATOMIC_RELAXED);
        }
        filter_dirty = 1;
    }
    else if (bucket_counts[slot] > 0 && --bucket_counts[slot] == 0) {
        __atomic_fetch_and(&hw_sample_bits[slot / 64], ~bit, __ATOMIC_RELAXED);
    }
}

void
hw_filter_clear_unlocked(void)
{
    if (filter_dirty) {
        for (size_t i = 0; i < sizeof(hw_sample_bits) / sizeof(hw_sample_bits[0]); i++) {
            __atomic_store_n(&hw_sample_bits[i], 0, __ATOMIC_RELAXED);
        }
        filter_dirty = 0;
    }
    hw_free(HW_MEM_TRACER, bucket_counts);
    bucket_counts = NULL;
}
