#include "compat.h" /* Python.h first: it sets _GNU_SOURCE, which accept4 needs */

#include "descriptors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Standard descriptors (bit n: descriptor n) found closed for longer than
 * HW_FD_PATIENCE_MS: closed for good, not waited for.  Protected by the
 * GIL: only the main interpreter's agent calls in here. */
static unsigned closed_for_good;

#define WAIT_STEP_MS 2

static unsigned
closed_standard(void)
{
    unsigned closed = 0;
    for (int fd = 0; fd < HW_FD_FLOOR; fd++) {
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            closed |= 1u << fd;
        }
    }
    return closed;
}

/* Returns, with the GIL held, once 0, 1 and 2 are open or closed for good;
 * waits meanwhile with the GIL released.  Closed for good is closed at every
 * look for HW_FD_PATIENCE_MS: a number the service closes and reopens again
 * and again is a window each time, waited out however long it goes on. */
static void
wait_for_standard(void)
{
    const struct timespec step = {0, WAIT_STEP_MS * 1000000L};
    unsigned always_closed = ~0u;
    for (int waited = 0;; waited += WAIT_STEP_MS) {
        unsigned closed = closed_standard();
        closed_for_good &= closed; /* open again: waited for next time */
        always_closed &= closed;
        if (waited >= HW_FD_PATIENCE_MS) {
            closed_for_good |= always_closed;
        }
        if ((closed & ~closed_for_good) == 0) {
            return;
        }
        Py_BEGIN_ALLOW_THREADS
        (void)nanosleep(&step, NULL);
        Py_END_ALLOW_THREADS
    }
}

/* Closes `fd`, leaving errno as the call that failed before left it. */
static void
close_keeping_errno(int fd)
{
    int saved = errno;
    (void)close(fd);
    errno = saved;
}

/* Moves `fd` to HW_FD_FLOOR or above, closing the low number; keeps a
 * descriptor already there.  Returns the new number, or -1 with errno set
 * (the descriptor closed). */
static int
above_floor(int fd)
{
    if (fd >= HW_FD_FLOOR) {
        return fd;
    }
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, HW_FD_FLOOR);
    close_keeping_errno(fd);
    return moved;
}

ssize_t
hw_read_small_file(const char *path, char *buf, size_t limit)
{
    wait_for_standard();
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        return -1;
    }
    struct stat st;
    ssize_t total = -1;
    if (fstat(fd, &st) < 0) {
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        errno = EINVAL;
        goto done;
    }
    total = 0;
    while ((size_t)total < limit) {
        ssize_t n = read(fd, buf + total, limit - (size_t)total);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            total = -1;
            break;
        }
        if (n == 0) {
            break;
        }
        total += n;
    }
done:
    close_keeping_errno(fd);
    return total;
}

DIR *
hw_opendir(const char *path)
{
    wait_for_standard();
    return opendir(path); /* (close-on-exec and non-blocking, as glibc opens it) */
}

long
hw_count_dir_entries(const char *path)
{
    DIR *dir = hw_opendir(path);
    if (dir == NULL) {
        return -1;
    }
    long count = 0;
    const struct dirent *entry;
    errno = 0;
    while ((entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) {
            count++;
        }
    }
    int saved = errno;
    (void)closedir(dir);
    errno = saved;
    return saved != 0 ? -1 : count;
}

int
hw_accept_above_floor(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0) {
        return -1;
    }
    if (!(flags & O_NONBLOCK)) {
        return -2;
    }
    wait_for_standard();
    int conn;
    do {
        conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    } while (conn < 0 && errno == EINTR);
    return conn < 0 ? -1 : above_floor(conn);
}

int
hw_open_above_floor(const char *path, int flags, int mode)
{
    wait_for_standard();
    int fd;
    do {
        fd = open(path, flags | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, (mode_t)mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        return -1;
    }
    if (!(flags & O_NONBLOCK)) {
        int now = fcntl(fd, F_GETFL);
        if (now < 0 || fcntl(fd, F_SETFL, now & ~O_NONBLOCK) < 0) {
            close_keeping_errno(fd);
            return -1;
        }
    }
    return above_floor(fd);
}
