/* A set of records keyed by content, for interning.
 *
 * Every record kept in a pset begins with its 64-bit hash (a uint64_t first
 * member), so the set stores bare pointers and never recomputes a hash.
 * Linear probing with backward-shift deletion.  Not thread-safe: each set
 * says which lock guards it.
 */
#ifndef HEAPWATCH_PSET_H
#define HEAPWATCH_PSET_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void **slots;
    size_t mask;
    size_t count;
} hw_pset_t;

/* Compares a stored record with a lookup key; returns non-zero when equal. */
typedef int (*hw_pset_eq_t)(const void *record, const void *key);

int hw_pset_init(hw_pset_t *set, size_t capacity);
void hw_pset_fini(hw_pset_t *set);
size_t hw_pset_footprint(const hw_pset_t *set);
void *hw_pset_find(const hw_pset_t *set, uint64_t hash, hw_pset_eq_t eq, const void *key);
/* Adds a record that is not in the set.  Returns 0, or -1 when out of memory. */
int hw_pset_add(hw_pset_t *set, void *record);
/* Removes a record (by identity) that is in the set. */
void hw_pset_remove(hw_pset_t *set, void *record);

static inline uint64_t
hw_record_hash(const void *record)
{
    return *(const uint64_t *)record;
}

#endif
