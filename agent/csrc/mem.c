#include "mem.h"

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Atomic counters: updated by hooks running without the GIL. */
static size_t hw_mem_bytes[HW_MEM_NCATEGORIES];

static inline void
account(hw_mem_category_t cat, void *ptr, int sign)
{
    size_t usable = malloc_usable_size(ptr);
    if (sign > 0) {
        __atomic_add_fetch(&hw_mem_bytes[cat], usable, __ATOMIC_RELAXED);
    }
    else {
        __atomic_sub_fetch(&hw_mem_bytes[cat], usable, __ATOMIC_RELAXED);
    }
}

__attribute__((noinline)) void *
hw_malloc(hw_mem_category_t cat, size_t size)
{
    int err = errno;
    void *ptr = malloc(size ? size : 1);
    if (ptr != NULL) {
        account(cat, ptr, +1);
    }
    errno = err;
    return ptr;
}

__attribute__((noinline)) void *
hw_calloc(hw_mem_category_t cat, size_t nelem, size_t elsize)
{
    int err = errno;
    void *ptr = calloc(nelem ? nelem : 1, elsize ? elsize : 1);
    if (ptr != NULL) {
        account(cat, ptr, +1);
    }
    errno = err;
    return ptr;
}

__attribute__((noinline)) void *
hw_calloc_huge(hw_mem_category_t cat, size_t nelem, size_t elsize)
{
    const size_t huge = (size_t)2 << 20;
    if (elsize == 0 || nelem > SIZE_MAX / elsize) {
        return NULL;
    }
    size_t size = nelem * elsize;
    if (size < 2 * huge) {
        return hw_calloc(cat, nelem, elsize);
    }
    int err = errno;
    void *ptr;
    if (posix_memalign(&ptr, huge, size) != 0) {
        errno = err;
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(ptr, size, MADV_HUGEPAGE); /* advice: failure is harmless */
#endif
    memset(ptr, 0, size);
    account(cat, ptr, +1);
    errno = err;
    return ptr;
}

__attribute__((noinline)) void *
hw_realloc(hw_mem_category_t cat, void *ptr, size_t size)
{
    if (ptr == NULL) {
        return hw_malloc(cat, size);
    }
    int err = errno;
    size_t old = malloc_usable_size(ptr);
    void *ptr2 = realloc(ptr, size ? size : 1);
    errno = err;
    if (ptr2 == NULL) {
        return NULL;
    }
    __atomic_sub_fetch(&hw_mem_bytes[cat], old, __ATOMIC_RELAXED);
    account(cat, ptr2, +1);
    return ptr2;
}

__attribute__((noinline)) void
hw_free(hw_mem_category_t cat, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    int err = errno;
    account(cat, ptr, -1);
    free(ptr);
    errno = err;
}

size_t
hw_mem_used(hw_mem_category_t cat)
{
    return __atomic_load_n(&hw_mem_bytes[cat], __ATOMIC_RELAXED);
}
