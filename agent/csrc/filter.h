/* The sampled-block filter: whether a block may have been sampled.
 *
 * Freeing must know whether a block was sampled without a table lookup.
 * hw_sample_bits has one bit per bucket of addresses, set while some
 * sampled live block hashes there: a clear bit proves the block was not
 * sampled.  It is 16 KiB, so the check on every free stays in cache; the
 * per-bucket counts behind it are only touched under hw_tables_lock, when a
 * sampled block comes or goes.  A free happens after its malloc returned the
 * pointer, so it sees the bit that malloc set.
 */
#ifndef HEAPWATCH_FILTER_H
#define HEAPWATCH_FILTER_H

#include <stddef.h>
#include <stdint.h>

#define HW_FILTER_BITS 17
extern uint64_t hw_sample_bits[(1u << HW_FILTER_BITS) / 64];

/* One bit per 16-byte granule of a block's start address, modulo 2 MiB: the
 * blocks of one pymalloc pool share a cache line of the bitmap as they share
 * their own, so frees rarely miss the cache on it (a multiplicative hash put
 * each free on a random line of the 16 KiB).  Addresses 2 MiB apart share a
 * bit: a false positive costs a table lookup under the lock, never a wrong
 * answer. */
static inline size_t
hw_filter_slot(uintptr_t ptr)
{
    return (size_t)((ptr >> 4) & ((1u << HW_FILTER_BITS) - 1));
}

static inline int
hw_filter_maybe(const void *ptr)
{
    size_t slot = hw_filter_slot((uintptr_t)ptr);
    uint64_t word = __atomic_load_n(&hw_sample_bits[slot / 64], __ATOMIC_RELAXED);
    return (word >> (slot % 64)) & 1;
}

/* hw_tables_lock held. */
void hw_filter_add_unlocked(uintptr_t ptr, int delta);
void hw_filter_clear_unlocked(void);

#endif
