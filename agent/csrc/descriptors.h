/* Descriptors heapwatch makes in its own threads.
 *
 * A service may close one of its standard descriptors and dup2() another
 * onto that number later: CPython's test_subprocess closes 0, 1 or 2 around
 * a Popen and restores them after.  open() and accept() hand out the lowest
 * free number, so a thread of ours making one in that window took the
 * service's number: the service then saw a descriptor it had not opened,
 * its dup2() replaced our file with its stdout (or failed with EBUSY), and
 * our close() closed its stdout (the guest run's test_subprocess ended with
 * exit status 120, its output cut short).
 *
 * So these calls run with the GIL held, which the service's Python code
 * needs to close or dup2 anything, and only while 0, 1 and 2 are all open:
 * a service thread may then be inside one close() (the GIL released for
 * it), and we may get that number, but its dup2() onto it needs the GIL
 * first, and by then a file read is closed and a connection moved above 2.
 * While a standard descriptor is closed they wait, the GIL released, for
 * the service to put it back; one seen closed at every look for
 * HW_FD_PATIENCE_MS is taken for closed for good (a daemon's stdin), not a
 * window, and no longer waited for until it is open again.  (A dup2() onto a closed number
 * above 2 is not watched for: services juggle the standard three.)
 */
#ifndef HEAPWATCH_DESCRIPTORS_H
#define HEAPWATCH_DESCRIPTORS_H

#include <dirent.h>
#include <stddef.h>
#include <sys/types.h>

/* The lowest number a descriptor of ours keeps: above stdin, stdout and
 * stderr, the numbers services close and restore. */
#define HW_FD_FLOOR 3
/* How long a standard descriptor may stay closed before it counts as
 * closed for good. */
#define HW_FD_PATIENCE_MS 200

/* Reads at most `limit` bytes of the regular file `path` into `buf` (open,
 * read, close), without blocking on a FIFO.  Returns the byte count, or -1
 * with errno set.  Call it with the GIL held (it may wait without it). */
ssize_t hw_read_small_file(const char *path, char *buf, size_t limit);

/* The entries of the directory `path` but "." and "..", or -1 with errno
 * set.  Call it with the GIL held (it may wait without it). */
long hw_count_dir_entries(const char *path);

/* opendir(`path`) (close-on-exec), its descriptor made with the GIL held:
 * for listing a directory, entry by entry, with the GIL kept until
 * closedir().  NULL with errno set.  Call it with the GIL held (it may wait
 * without it). */
DIR *hw_opendir(const char *path);

/* accept4() on the listening socket `fd` (which must be non-blocking: with
 * the GIL held it may not wait), the connection's descriptor close-on-exec
 * and numbered HW_FD_FLOOR or above.  Returns it, -1 with errno set
 * (EAGAIN: no connection waiting), or -2 if `fd` is a blocking socket.
 * Call it with the GIL held (it may wait without it). */
int hw_accept_above_floor(int fd);

/* open() of `path` with `flags` (O_CLOEXEC added) and `mode`, numbered
 * HW_FD_FLOOR or above: a file heapwatch writes unasked (a black-box dump,
 * the termination log) or keeps open.  Returns the descriptor, or -1 with
 * errno set.  Call it with the GIL held (it may wait without it); a FIFO
 * opened for writing could block, so O_NONBLOCK is added for the open
 * itself and taken off again. */
int hw_open_above_floor(const char *path, int flags, int mode);

#endif
