#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "thread.h"

#include <pthread.h>

#include "mem.h"
#include "sync.h"

__thread hw_tls_t hw_tls __attribute__((tls_model("initial-exec")));
__thread hw_thread_t *hw_my_thread __attribute__((tls_model("initial-exec")));

/* Every live state; hw_tables_lock. */
static hw_thread_t *all_threads;
/* Its destructor frees a thread's state at thread exit.  Set once at import,
 * with the GIL. */
static pthread_key_t thread_key;
static int thread_key_ready;

static void
thread_free(hw_thread_t *thread)
{
    if (thread->memo != NULL) {
        hw_memo_free(thread->memo);
    }
    hw_free(HW_MEM_TRACER, thread);
}

static void
unlink_unlocked(hw_thread_t *thread)
{
    if (thread->prev != NULL) {
        thread->prev->next = thread->next;
    }
    else {
        all_threads = thread->next;
    }
    if (thread->next != NULL) {
        thread->next->prev = thread->prev;
    }
}

static void
thread_destroy(void *arg)
{
    hw_thread_t *thread = arg;
    hw_my_thread = HW_THREAD_GONE;
    hw_lock();
    unlink_unlocked(thread);
    hw_unlock();
    thread_free(thread);
}

HW_COLD hw_thread_t *
hw_thread_create(void)
{
    if (!thread_key_ready) {
        return NULL;
    }
    hw_thread_t *thread = hw_calloc(HW_MEM_TRACER, 1, sizeof(*thread));
    if (thread == NULL) {
        return NULL;
    }
    if (pthread_setspecific(thread_key, thread) != 0) {
        hw_free(HW_MEM_TRACER, thread);
        return NULL;
    }
    hw_lock();
    thread->next = all_threads;
    if (all_threads != NULL) {
        all_threads->prev = thread;
    }
    all_threads = thread;
    hw_unlock();
    hw_my_thread = thread;
    return thread;
}

int
hw_thread_init_once(void)
{
    if (thread_key_ready) {
        return 0;
    }
    int err = pthread_key_create(&thread_key, thread_destroy);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    thread_key_ready = 1;
    return 0;
}

void
hw_thread_fork_child_unlocked(void)
{
    hw_thread_t *thread = all_threads;
    while (thread != NULL) {
        hw_thread_t *next = thread->next;
        if (thread != hw_my_thread) {
            unlink_unlocked(thread);
            thread_free(thread);
        }
        thread = next;
    }
}
