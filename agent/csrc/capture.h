/* Capturing the calling thread's frames, with a per-thread memo of the stack
 * it walked last.
 *
 * A frame is captured as (code object, instruction offset); total_nframe is
 * the real depth of the stack, as in the stdlib.  Finding that depth by
 * following `previous` pointers is a chain of dependent loads, one per frame:
 * at depth 50 it was a third of the deep_stack benchmark's time.  So each
 * thread keeps the chain of frames it walked last (outermost first) and an
 * index from frame address to position.  When the innermost frame is found
 * there, the rest of the chain is verified instead of walked: chain[i]'s
 * previous must be chain[i - 1], down to chain[0] whose previous is NULL.
 * The addresses are known in advance, so those loads do not wait for one
 * another.  The answer is exact: two chains whose links all agree are the
 * same list, whatever ran in between.  A frame is dereferenced only once the
 * link above it proved it is on the live chain, so a stale entry is never
 * read.
 */
#ifndef HEAPWATCH_CAPTURE_H
#define HEAPWATCH_CAPTURE_H

#include <stdint.h>

#include "compat.h"

#define HW_CAPTURE_LOCAL 64

/* Frame keys: a PyCodeObject* (strong reference held by the traceback), a
 * hw_rawname_t* tagged with HW_FRAME_RAW, or 0 for "<unknown>". */
#define HW_FRAME_RAW ((uintptr_t)1)

/* Frames compare with memcmp(): no padding, no cached state. */
typedef struct {
    uintptr_t key;
    int64_t lasti; /* code frames: byte offset; other frames: the line number */
} hw_frame_t;

typedef struct {
    hw_frame_t *frames; /* local or heap */
    int nframe;
    uint16_t total_nframe;
    uint16_t route; /* routes.h: 0 unless the caller reads it */
    int no_code_refs;
    hw_frame_t local[HW_CAPTURE_LOCAL];
} hw_capture_t;

/* Walks the calling thread's frames (tstate may be NULL: no frames).  Code
 * pointers are borrowed; they stay valid while the calling thread is inside
 * the hook, since the frames naming them are its own.  With count_depth,
 * total_nframe is the stack's whole depth (the stdlib's); without, the walk
 * stops below the frames kept, and total_nframe is their number, plus one
 * when a frame that counts lies below them (the agent's profile: still
 * "truncated" when above nframe, at no cost per frame).  May create the
 * thread's state (thread.h), so hw_tables_lock must not be held.  Returns
 * 0, or -1 when a heap buffer for more than HW_CAPTURE_LOCAL frames cannot
 * be had. */
int hw_capture(hw_capture_t *cap, PyThreadState *tstate, int no_code_refs, int max_nframe,
               int count_depth);
void hw_capture_release(hw_capture_t *cap);

#endif
