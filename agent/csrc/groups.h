/* Aggregation in C: a snapshot's statistics grouped by traceback, filename or
 * line, and differences between two groupings.  Costs grow with the number
 * of distinct tracebacks and sites, never with the number of live blocks.
 *
 * Orders are exactly the stdlib's: statistics by (size, count, traceback)
 * descending; differences by (|size_diff|, size, |count_diff|, count,
 * traceback) descending; tracebacks compare as tuples of (filename, lineno)
 * from the oldest frame.  Keys are unique, so the order is total.
 *
 * Boundary tuples:
 *   statistic  (frames, size, count)
 *   diff       (frames, size, size_diff, count, count_diff)
 *   peak       (frames, size, count, peak)
 *   ages       (frames, size, count, histogram)
 * where histogram is a tuple of HW_AGE_BUCKETS estimated byte counts: bucket 0
 * for traces of age 0, bucket b for ages in [2**(b-1), 2**b), in epochs.
 * where frames is the key in raw order (most recent first).
 *
 * Groups also sum each traceback's size in the interval's peak state
 * (tracer.h), over the snapshot's tracebacks with live traces and those
 * holding only a peak; the groups of the latter alone come after the others
 * (index nlive and up) and only peaks() shows them.
 */
#ifndef HEAPWATCH_GROUPS_H
#define HEAPWATCH_GROUPS_H

#include "compat.h"
#include "snapshot.h"
#include "tracer.h"

typedef enum { HW_KEY_TRACEBACK = 0, HW_KEY_FILENAME = 1, HW_KEY_LINENO = 2 } hw_key_type_t;

/* Ages up to HW_MAX_AGE = 2**15 epochs: 0, then 15 powers of two, then 2**15. */
#define HW_AGE_BUCKETS 17

typedef struct {
    uint64_t hash;
    uint64_t size;
    uint64_t est_blocks;
    uint64_t peak;
    uint32_t key_off;
    uint32_t key_len;
} hw_group_t;

typedef struct {
    hw_group_t *groups;
    size_t ngroups;
    size_t nlive; /* groups with live traces: 0 .. nlive-1 */
    size_t cap;
    hw_rframe_t *keys;
    size_t nkeys;
    size_t keys_cap;
    uint32_t *index; /* open addressing: group index + 1; 0 empty */
    size_t index_mask;
    uint32_t *order; /* statistics order, computed once */
    PyObject *filenames; /* keeps key filenames alive */
    uint64_t total_size;
    uint64_t total_est_blocks;
    uint64_t total_peak;
    uint64_t *ages; /* HW_AGE_BUCKETS per group; NULL unless built with ages */
} hw_groups_t;

/* GIL held.  mask: one byte for each of the first mask_len snapshot
 * tracebacks, non-zero to include; those past mask_len (all if mask is
 * NULL) are included.  ages: also histogram the traces by age (a snapshot
 * with traces, not cumulative: the caller checks).  NULL with an exception
 * set. */
hw_groups_t *hw_groups_build(hw_snapshot_t *snap, hw_key_type_t key_type, int cumulative,
                             const unsigned char *mask, size_t mask_len, int ages);
void hw_groups_free(hw_groups_t *groups);
/* limit < 0: all. */
PyObject *hw_groups_statistics(hw_groups_t *groups, Py_ssize_t limit);
/* Every group's (frames, size, count, peak), by peak, size, count, then
 * traceback, descending. */
PyObject *hw_groups_peaks(hw_groups_t *groups, Py_ssize_t limit);
/* The first statistics with their age histograms (built with ages). */
PyObject *hw_groups_ages(hw_groups_t *groups, Py_ssize_t limit);
PyObject *hw_groups_compare(hw_groups_t *cur, hw_groups_t *old, Py_ssize_t limit);
/* The first `limit` statistics of cur, with their differences from old
 * (old may be NULL: everything is new). */
PyObject *hw_groups_growth(hw_groups_t *cur, hw_groups_t *old, Py_ssize_t limit);

static inline uint64_t
hw_count_round(uint64_t est_blocks)
{
    return (est_blocks + HW_COUNT_ONE / 2) >> HW_COUNT_SHIFT;
}

#endif
