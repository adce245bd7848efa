#include "sync.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Alone on its cache line: written twice per traced operation.  Atomics
 * only (it is the lock). */
int hw_tables_lock __attribute__((aligned(64)));

static void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

__attribute__((noinline, cold)) void
hw_lock_contended(void)
{
    /* A short spin first: holders keep the lock for well under a
     * microsecond. */
    for (int spins = 0; spins < 100; spins++) {
        cpu_relax();
        int expected = 0;
        if (__atomic_load_n(&hw_tables_lock, __ATOMIC_RELAXED) == 0 &&
            __atomic_compare_exchange_n(&hw_tables_lock, &expected, 1, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
            return;
        }
    }
    /* The timeout bounds a wake-up lost to hw_unlock's plain store. */
    const struct timespec timeout = {0, 200 * 1000};
    int err = errno; /* the wait sets EAGAIN or ETIMEDOUT: see sync.h */
    while (__atomic_exchange_n(&hw_tables_lock, 2, __ATOMIC_ACQUIRE) != 0) {
        syscall(SYS_futex, &hw_tables_lock, FUTEX_WAIT_PRIVATE, 2, &timeout, NULL, 0);
    }
    errno = err;
}

__attribute__((noinline, cold)) void
hw_unlock_wake(void)
{
    int err = errno;
    syscall(SYS_futex, &hw_tables_lock, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    errno = err;
}
