#include "compat.h" /* Python.h first: it sets _GNU_SOURCE, which dladdr needs */

#include "nativeheap.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

/* glibc's struct mallinfo2, declared here so that building needs no header
 * of glibc 2.33 or later: the function is looked up at run time. */
typedef struct {
    size_t arena;    /* bytes of the arenas' sbrk/mmap'd heaps */
    size_t ordblks;  /* free chunks */
    size_t smblks;   /* free fastbin chunks */
    size_t hblks;    /* mmap'd chunks */
    size_t hblkhd;   /* bytes in mmap'd chunks */
    size_t usmblks;  /* unused */
    size_t fsmblks;  /* bytes in free fastbin chunks */
    size_t uordblks; /* bytes in chunks in use */
    size_t fordblks; /* bytes in free chunks */
    size_t keepcost; /* bytes at the top, releasable */
} hw_mallinfo2_t;

typedef hw_mallinfo2_t (*mallinfo2_fn)(void);

/* Written once under lookup_once. */
static mallinfo2_fn mallinfo2_ptr;
static pthread_once_t lookup_once = PTHREAD_ONCE_INIT;

static void
lookup(void)
{
    void *found = dlsym(RTLD_DEFAULT, "mallinfo2");
    if (found == NULL) {
        return;
    }
    /* The malloc the process calls must be the one mallinfo2 describes. */
    Dl_info of_mallinfo2, of_malloc;
    if (dladdr(found, &of_mallinfo2) == 0 || dladdr((void *)malloc, &of_malloc) == 0 ||
        of_mallinfo2.dli_fbase != of_malloc.dli_fbase) {
        return;
    }
    mallinfo2_ptr = (mallinfo2_fn)found;
}

int
hw_native_heap_available(void)
{
    pthread_once(&lookup_once, lookup);
    return mallinfo2_ptr != NULL;
}

int
hw_native_heap(uint64_t *in_use, uint64_t *retained)
{
    if (!hw_native_heap_available()) {
        return -1;
    }
    hw_mallinfo2_t info = mallinfo2_ptr();
    *in_use = (uint64_t)info.uordblks + (uint64_t)info.hblkhd;
    *retained = (uint64_t)info.fordblks;
    return 0;
}
