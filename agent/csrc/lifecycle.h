/* The tracer's lifecycle: start, stop, housekeeping, interpreter exit.
 *
 * Above the hooks: start puts the allocator hooks, the reference tracer
 * (3.13+) and the PyTraceMalloc_Track interposition in place around the
 * tracer's tables (tracer.h), stop takes them out, and none of those calls
 * back up here.  ddtrace's profiler has the same shape: _memalloc.cpp, which
 * swaps the allocators, on top of _memalloc_heap.cpp, its heap tracker.
 *
 * GIL held, hw_tables_lock not held.  Those returning int return -1 with an
 * exception set.
 */
#ifndef HEAPWATCH_LIFECYCLE_H
#define HEAPWATCH_LIFECYCLE_H

#include <stdint.h>

/* profile: HW_PROFILE_* (tracer.h). */
int hw_start(int max_nframe, int mode, uint64_t sample_interval, int profile);
void hw_stop(void);
/* What snapshots and drain() do first: release orphaned code objects and the
 * graveyard, shrink the trace tables toward live traces. */
void hw_housekeeping(void);
/* At interpreter exit: the hooks record nothing more; frees still untrack. */
void hw_at_exit(void);

#endif
