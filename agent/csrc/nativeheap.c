#include "compat.h" /* Python.h first: it sets _GNU_SOURCE, which RTLD_DEFAULT needs */

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
/* The probe escapes through it, so that the compiler keeps its malloc. */
static void *volatile probe_block;

#define PROBE_BYTES ((size_t)4 << 20)

static size_t
in_use_of(mallinfo2_fn mallinfo2)
{
    hw_mallinfo2_t info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

static void
lookup(void)
{
    mallinfo2_fn found = (mallinfo2_fn)dlsym(RTLD_DEFAULT, "mallinfo2");
    if (found == NULL) {
        return;
    }
    /* Believed only if it sees the blocks the process's malloc hands out
     * (not those of jemalloc or tcmalloc preloaded).  The address of malloc
     * cannot tell whose it is: in a non-PIE executable that takes it
     * (Debian's python3) it is the executable's own PLT entry.  Other threads
     * may free meanwhile: a few tries. */
    for (int attempt = 0; attempt < 3; attempt++) {
        size_t before = in_use_of(found);
        probe_block = malloc(PROBE_BYTES);
        if (probe_block == NULL) {
            return;
        }
        size_t after = in_use_of(found);
        free(probe_block);
        probe_block = NULL;
        if (after >= before + PROBE_BYTES) {
            mallinfo2_ptr = found;
            return;
        }
    }
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
