/* The C library's heap as it sees itself: what heapwatch cannot attribute.
 *
 * RSS minus traced bytes minus the tracer's own is memory no Python
 * allocation explains: a C library's blocks, or heap the allocator keeps
 * after they were freed (glibc's arenas: MALLOC_ARENA_MAX, not a code
 * change).  glibc's mallinfo2() tells the two apart.  It is looked up at run
 * time (glibc 2.33+), and only believed when it sees the blocks the
 * process's malloc hands out: with jemalloc or tcmalloc preloaded, glibc's
 * arenas are empty.
 */
#ifndef HEAPWATCH_NATIVEHEAP_H
#define HEAPWATCH_NATIVEHEAP_H

#include <stdint.h>

/* Whether hw_native_heap() can answer; looked up once, any thread. */
int hw_native_heap_available(void);
/* Bytes the allocator has handed out and not had back (in use) and bytes
 * free but kept in its arenas (retained).  Returns 0, or -1 when
 * unavailable.  Takes every arena's lock and walks their free lists: call
 * it once in a while, without the GIL. */
int hw_native_heap(uint64_t *in_use, uint64_t *retained);

#endif
