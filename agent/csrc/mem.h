/* The tracer's own memory.
 *
 * It comes from libc directly, never from PyMem_Raw*: those may be hooked by
 * us (the hook would re-enter itself) or by another tracer, while libc is safe
 * without the GIL, inside fork handlers and after finalization.  Usable sizes
 * are counted per category so that get_tracemalloc_memory() follows RSS.
 * Each function leaves errno as it found it (see sync.h): libc's allocator
 * may set it, even on success (a failed mmap before a brk that works).
 */
#ifndef HEAPWATCH_MEM_H
#define HEAPWATCH_MEM_H

#include <stddef.h>

typedef enum {
    HW_MEM_TRACER = 0,   /* tables, tracebacks, names: get_tracemalloc_memory() */
    HW_MEM_SNAPSHOT = 1, /* buffers owned by snapshot and group objects */
    HW_MEM_NCATEGORIES
} hw_mem_category_t;

void *hw_malloc(hw_mem_category_t cat, size_t size);
void *hw_calloc(hw_mem_category_t cat, size_t nelem, size_t elsize);
/* Like hw_calloc; blocks of 4 MiB and more are 2 MiB aligned and advised to
 * use transparent huge pages.  Freed with hw_free. */
void *hw_calloc_huge(hw_mem_category_t cat, size_t nelem, size_t elsize);
/* On failure returns NULL and leaves ptr untouched. */
void *hw_realloc(hw_mem_category_t cat, void *ptr, size_t size);
void hw_free(hw_mem_category_t cat, void *ptr);

/* Bytes currently held in a category (atomic read). */
size_t hw_mem_used(hw_mem_category_t cat);

#endif
