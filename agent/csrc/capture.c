#include "capture.h"

#include <stddef.h>
#include <string.h>

#include "mem.h"
#include "thread.h"

/* Frames walked link by link before the memo takes over: on shallow stacks
 * the walk costs less than the memo's lookup and bookkeeping. */
#define PLAIN_STEPS 4

/* Deeper stacks are walked frame by frame, without a memo. */
#define MEMO_MAX_DEPTH (1u << 16)
#define MEMO_MIN_CAP 64u

typedef struct hw_memo {
    /* Outermost frame first.  Entries [0, written) were filled by some walk;
     * those past the current stack's depth are stale, and harmless: an entry
     * is trusted only once the live chain has reached it. */
    hw_pyframe_t **chain;
    hw_pyframe_t **scratch; /* frames walked by the current capture, innermost first */
    uint32_t *index;        /* hash of a frame address -> position + 1, 0 when empty */
    uint32_t cap;           /* entries of chain and of scratch; index has 2 * cap */
    uint32_t written;
    /* The last capture's whole stack is chain[0, last_depth), its innermost
     * frame last: the frames it walked plainly sit above those it verified,
     * not indexed.  0 when that capture did not go through the memo. */
    uint32_t last_depth;
    int index_shift;
} memo_t;

/* The index has 2 * cap slots, cap a power of two. */
static int
index_shift(uint32_t cap)
{
    int bits = 1;
    while (((uint32_t)1 << (bits - 1)) < cap) {
        bits++;
    }
    return 64 - bits;
}

static inline uint32_t
memo_slot(const memo_t *memo, const hw_pyframe_t *frame)
{
    return (uint32_t)(((uint64_t)(uintptr_t)frame * UINT64_C(0x9E3779B97F4A7C15)) >>
                      memo->index_shift);
}

static inline void
memo_note(memo_t *memo, uint32_t pos)
{
    memo->index[memo_slot(memo, memo->chain[pos])] = pos + 1;
}

/* The position of frame in the chain, if the index knows it.  A direct-mapped
 * index: a collision only costs a frame that is walked instead of verified. */
static inline int
memo_find(const memo_t *memo, const hw_pyframe_t *frame, uint32_t *pos)
{
    uint32_t entry = memo->index[memo_slot(memo, frame)];
    if (entry == 0 || entry > memo->written || memo->chain[entry - 1] != frame) {
        return 0;
    }
    *pos = entry - 1;
    return 1;
}

void
hw_memo_free(memo_t *memo)
{
    hw_free(HW_MEM_TRACER, memo->chain);
    hw_free(HW_MEM_TRACER, memo->scratch);
    hw_free(HW_MEM_TRACER, memo->index);
    hw_free(HW_MEM_TRACER, memo);
}

/* Room for need frames.  Returns -1 past MEMO_MAX_DEPTH or out of memory,
 * the memo unchanged but for larger arrays. */
static HW_COLD int
memo_reserve_slow(memo_t *memo, uint32_t need);

static inline int
memo_reserve(memo_t *memo, uint32_t need)
{
    return need <= memo->cap ? 0 : memo_reserve_slow(memo, need);
}

static HW_COLD int
memo_reserve_slow(memo_t *memo, uint32_t need)
{
    if (need > MEMO_MAX_DEPTH) {
        return -1;
    }
    uint32_t cap = memo->cap;
    while (cap < need) {
        cap *= 2;
    }
    hw_pyframe_t **chain = hw_realloc(HW_MEM_TRACER, memo->chain, cap * sizeof(*chain));
    if (chain == NULL) {
        return -1;
    }
    memo->chain = chain;
    hw_pyframe_t **scratch = hw_realloc(HW_MEM_TRACER, memo->scratch, cap * sizeof(*scratch));
    if (scratch == NULL) {
        return -1;
    }
    memo->scratch = scratch;
    uint32_t *index = hw_calloc(HW_MEM_TRACER, 2 * (size_t)cap, sizeof(*index));
    if (index == NULL) {
        return -1;
    }
    hw_free(HW_MEM_TRACER, memo->index);
    memo->index = index;
    memo->index_shift = index_shift(cap);
    memo->cap = cap;
    for (uint32_t pos = 0; pos < memo->written; pos++) {
        memo_note(memo, pos);
    }
    return 0;
}

static HW_COLD memo_t *
memo_create(void)
{
    memo_t *memo = hw_calloc(HW_MEM_TRACER, 1, sizeof(*memo));
    if (memo == NULL) {
        return NULL;
    }
    memo->cap = MEMO_MIN_CAP;
    memo->chain = hw_malloc(HW_MEM_TRACER, MEMO_MIN_CAP * sizeof(*memo->chain));
    memo->scratch = hw_malloc(HW_MEM_TRACER, MEMO_MIN_CAP * sizeof(*memo->scratch));
    memo->index = hw_calloc(HW_MEM_TRACER, 2 * MEMO_MIN_CAP, sizeof(*memo->index));
    memo->index_shift = index_shift(MEMO_MIN_CAP);
    if (memo->chain == NULL || memo->scratch == NULL || memo->index == NULL) {
        hw_memo_free(memo);
        return NULL;
    }
    return memo;
}

/* Continues a capture down chain[depth - 1] (innermost) .. chain[0]: records
 * (code, offset) of frames that count until max_nframe are recorded, and
 * counts the rest. */
static inline void
capture_from_chain(hw_capture_t *cap, uint32_t *total, hw_pyframe_t *const *chain, uint32_t depth,
                   int max_nframe)
{
#if HW_EVERY_FRAME_COUNTS
    if (cap->nframe >= max_nframe) {
        *total += depth; /* captured enough already: only the depth is left */
        return;
    }
#endif
    hw_frame_t *out = cap->frames + cap->nframe;
    hw_frame_t *const end = cap->frames + max_nframe;
    hw_pyframe_t *const *next = chain + depth; /* one past the innermost */
    while (next > chain && out < end) {
        hw_pyframe_t *frame = *--next;
        if (HW_EVERY_FRAME_COUNTS || hw_frame_counts_below(frame)) {
            PyCodeObject *code = hw_frame_code(frame);
            out->key = (uintptr_t)code;
            out->lasti = hw_frame_lasti(frame, code);
            out++;
        }
    }
    uint32_t captured = (uint32_t)(out - (cap->frames + cap->nframe));
#if HW_EVERY_FRAME_COUNTS
    *total += captured + (uint32_t)(next - chain);
#else
    uint32_t counted = 0;
    while (next > chain) {
        counted += (uint32_t)hw_frame_counts_below(*--next);
    }
    *total += captured + counted;
#endif
    cap->nframe = (int)(out - cap->frames);
}

/* Verifies the memo's chain from *live (a live frame) down: returns the
 * lowest entry proven live, each one by the link of the entry above it.
 * Every link is read at an address taken from the memo, not from the link
 * just found equal to it, so that the reads do not wait for one another;
 * and a frame is read only once proven live, since a stale entry may point
 * into freed memory.  In assembly on x86-64: a compiler that sees a link
 * equal to the next entry may read the next frame through the link, which
 * chains the reads again (it did). */
static inline hw_pyframe_t **
verify_links(hw_pyframe_t **live, hw_pyframe_t **bottom)
{
#if defined(__x86_64__)
    /* Three instructions a link: load the entry below, compare it with the
     * link read through the entry above, branch.  Eight links a round; the
     * last 0 to 7 links enter a round part-way (a jump table), as if it
     * started 8 entries above the bottom. */
    hw_pyframe_t *above = *live;
    hw_pyframe_t *next;
    uintptr_t tmp;
    uintptr_t table;
    __asm__("cmp %[limit], %[live]\n\t"
            "jb 3f\n"
            "1:\n\t"
            "mov -8(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 4f\n"
            "22:\n\t"
            "mov -16(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 11f\n"
            "23:\n\t"
            "mov -24(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 12f\n"
            "24:\n\t"
            "mov -32(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 13f\n"
            "25:\n\t"
            "mov -40(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 14f\n"
            "26:\n\t"
            "mov -48(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 15f\n"
            "27:\n\t"
            "mov -56(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 16f\n"
            "28:\n\t"
            "mov -64(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 17f\n\t"
            "sub $64, %[live]\n\t"
            "cmp %[limit], %[live]\n\t"
            "jae 1b\n"
            /* r links left (0 to 7): enter at link 9 - r of a round whose
             * live is 8 entries above the bottom.  Odd links read the entry
             * above from %[above], even ones from %[next]. */
            "3:\n\t"
            "mov %[live], %[tmp]\n\t"
            "sub %[bottom], %[tmp]\n\t"
            "jz 4f\n\t"
            "lea 64(%[bottom]), %[live]\n\t"
            "mov %[above], %[next]\n\t"
            "shr $1, %[tmp]\n\t"
            "lea 9f(%%rip), %[table]\n\t"
            "movslq (%[table],%[tmp]), %[tmp]\n\t"
            "add %[table], %[tmp]\n\t"
            "jmp *%[tmp]\n"
            /* A mismatch at link k (1-based) proved k - 1 entries below. */
            "17:\n\t"
            "sub $8, %[live]\n"
            "16:\n\t"
            "sub $8, %[live]\n"
            "15:\n\t"
            "sub $8, %[live]\n"
            "14:\n\t"
            "sub $8, %[live]\n"
            "13:\n\t"
            "sub $8, %[live]\n"
            "12:\n\t"
            "sub $8, %[live]\n"
            "11:\n\t"
            "sub $8, %[live]\n\t"
            "jmp 4f\n\t"
            /* By r, 4 bytes an entry: where r links left start. */
            ".p2align 2\n"
            "9:\n\t"
            ".long 4f - 9b\n\t"
            ".long 28b - 9b\n\t"
            ".long 27b - 9b\n\t"
            ".long 26b - 9b\n\t"
            ".long 25b - 9b\n\t"
            ".long 24b - 9b\n\t"
            ".long 23b - 9b\n\t"
            ".long 22b - 9b\n"
            "4:"
            : [live] "+r"(live), [above] "+r"(above), [next] "=&r"(next), [tmp] "=&r"(tmp),
              [table] "=&r"(table)
            : [bottom] "r"(bottom), [limit] "r"(bottom + 8), [off] "i"(HW_FRAME_BACK_OFFSET)
            : "cc", "memory");
    return live;
#else
    while (live > bottom && hw_frame_back(*live) == live[-1]) {
        live--;
    }
    return live;
#endif
}

/* Continues a capture from top down with the memo, and leaves the live
 * chain from top down in it.  Returns -1, having captured nothing more, when
 * the memo cannot hold the stack: the caller walks plainly. */
static inline int
walk_with_memo(memo_t *memo, hw_capture_t *cap, uint32_t *total, hw_pyframe_t *top,
               int max_nframe, uint32_t *chain_depth)
{
    /* Frames above the first one the memo knows. */
    uint32_t nfresh = 0;
    hw_pyframe_t *frame = top;
    uint32_t pos = 0;
    int hit = 0;
    while (frame != NULL) {
        if (memo_find(memo, frame, &pos)) {
            hit = 1;
            break;
        }
        if (nfresh == memo->cap && memo_reserve(memo, nfresh + 1) < 0) {
            return -1;
        }
        memo->scratch[nfresh++] = frame;
        frame = hw_frame_back(frame);
    }
    /* Verify the chain below the hit: chain[low..pos] are live. */
    uint32_t low = 0;
    uint32_t ntail = 0;
    if (hit) {
        hw_pyframe_t **live = verify_links(&memo->chain[pos], memo->chain);
        hw_pyframe_t *below = hw_frame_back(*live);
        low = (uint32_t)(live - memo->chain);
        /* The stack changed below chain[low] (or ends there now): walk the rest. */
        for (frame = below; frame != NULL; frame = hw_frame_back(frame)) {
            if (nfresh + ntail == memo->cap && memo_reserve(memo, nfresh + ntail + 1) < 0) {
                return -1;
            }
            memo->scratch[nfresh + ntail++] = frame;
        }
    }
    if (HW_LIKELY(hit && low == 0 && ntail == 0 && nfresh == 0)) {
        /* The stack the memo holds, verified: nothing to update. */
        capture_from_chain(cap, total, memo->chain, pos + 1, max_nframe);
        *chain_depth = pos + 1;
        return 0;
    }
    uint32_t kept = hit ? pos - low + 1 : 0;
    uint32_t depth = ntail + kept + nfresh;
    if (memo_reserve(memo, depth + PLAIN_STEPS) < 0) {
        return -1;
    }
    hw_pyframe_t **chain = memo->chain;
    if (ntail != low) {
        memmove(&chain[ntail], &chain[low], kept * sizeof(*chain));
        for (uint32_t p = ntail; p < ntail + kept; p++) {
            memo_note(memo, p);
        }
    }
    for (uint32_t p = 0; p < ntail; p++) {
        chain[p] = memo->scratch[nfresh + ntail - 1 - p];
        memo_note(memo, p);
    }
    for (uint32_t p = ntail + kept; p < depth; p++) {
        chain[p] = memo->scratch[depth - 1 - p];
        memo_note(memo, p);
    }
    if (depth > memo->written) {
        memo->written = depth;
    }
    capture_from_chain(cap, total, chain, depth, max_nframe);
    *chain_depth = depth;
    return 0;
}

/* Continues a capture from frame down, following the links, for at most
 * max_steps frames.  Returns where it stopped (NULL at the bottom). */
static inline hw_pyframe_t *
walk_plain(hw_capture_t *cap, uint32_t *total, hw_pyframe_t *frame, int max_nframe,
           uint32_t max_steps, hw_pyframe_t **walked)
{
    hw_frame_t *out = cap->frames + cap->nframe;
    hw_frame_t *const end = cap->frames + max_nframe;
    uint32_t counted = 0;
    for (uint32_t steps = 0; frame != NULL; frame = hw_frame_back(frame), steps++) {
        if (steps == max_steps) {
            break;
        }
        if (walked != NULL) {
            walked[steps] = frame;
        }
        if (!hw_frame_counts_below(frame)) {
            continue;
        }
        counted++;
        if (out < end) {
            PyCodeObject *code = hw_frame_code(frame);
            out->key = (uintptr_t)code;
            out->lasti = hw_frame_lasti(frame, code);
            out++;
        }
    }
    cap->nframe = (int)(out - cap->frames);
    *total += counted;
    return frame;
}

/* Puts the PLAIN_STEPS frames a capture walked plainly above the depth
 * frames the memo verified below them: the next capture from the same
 * innermost frame verifies the whole stack at once. */
static inline void
remember_plain(memo_t *memo, uint32_t depth, hw_pyframe_t *const *walked)
{
    if (depth + PLAIN_STEPS > memo->cap) {
        return; /* no room without allocating: the next capture walks */
    }
    hw_pyframe_t **above = memo->chain + depth;
    for (uint32_t i = 0; i < PLAIN_STEPS; i++) {
        above[i] = walked[PLAIN_STEPS - 1 - i];
    }
    depth += PLAIN_STEPS;
    if (depth > memo->written) {
        memo->written = depth;
    }
    memo->last_depth = depth;
}

/* Captures the stack at once when it starts where the last one started and
 * all its links still hold: allocations in a row from one frame, the common
 * case, neither walk nor look up the top frames.  Returns 0, having
 * captured nothing, when the stack is another. */
static inline int
try_last_stack(memo_t *memo, hw_capture_t *cap, uint32_t *total, hw_pyframe_t *top,
               int max_nframe)
{
    hw_pyframe_t **chain = memo->chain;
    hw_pyframe_t **innermost = &chain[memo->last_depth - 1];
    if (*innermost != top) {
        return 0;
    }
    if (verify_links(innermost, chain) != chain || hw_frame_back(chain[0]) != NULL) {
        return 0;
    }
    capture_from_chain(cap, total, chain, memo->last_depth, max_nframe);
    return 1;
}

int
hw_capture(hw_capture_t *cap, PyThreadState *tstate, int no_code_refs, int max_nframe)
{
    cap->frames = cap->local;
    cap->nframe = 0;
    cap->total_nframe = 0;
    cap->no_code_refs = no_code_refs;
    if (max_nframe > HW_CAPTURE_LOCAL) {
        cap->frames = hw_malloc(HW_MEM_TRACER, sizeof(hw_frame_t) * (size_t)max_nframe);
        if (cap->frames == NULL) {
            cap->frames = cap->local;
            return -1;
        }
    }
    if (tstate == NULL) {
        return 0;
    }
    /* Only the innermost frames can be incomplete (still being set up); the
     * stdlib skips them. */
    hw_pyframe_t *frame = hw_frame_top(tstate);
    while (frame != NULL && hw_frame_code_if_complete(frame) == NULL) {
        frame = hw_frame_back(frame);
    }
    if (frame == NULL) {
        return 0;
    }
    uint32_t total = 0;
    hw_thread_t *thread = hw_thread_if_any();
    memo_t *memo = thread != NULL ? thread->memo : NULL;
    if (memo != NULL && memo->last_depth != 0 &&
        try_last_stack(memo, cap, &total, frame, max_nframe)) {
        cap->total_nframe = (uint16_t)(total > UINT16_MAX ? UINT16_MAX : total);
        return 0;
    }
    hw_pyframe_t *walked[PLAIN_STEPS];
    frame = walk_plain(cap, &total, frame, max_nframe, PLAIN_STEPS, walked);
    if (memo != NULL) {
        memo->last_depth = 0;
    }
    if (frame != NULL) {
        if (thread == NULL) {
            thread = hw_thread();
        }
        if (HW_UNLIKELY(memo == NULL) && thread != NULL) {
            memo = thread->memo = memo_create();
        }
        uint32_t depth;
        if (memo == NULL ||
            walk_with_memo(memo, cap, &total, frame, max_nframe, &depth) < 0) {
            walk_plain(cap, &total, frame, max_nframe, UINT32_MAX, NULL);
        } else {
            remember_plain(memo, depth, walked);
        }
    }
    cap->total_nframe = (uint16_t)(total > UINT16_MAX ? UINT16_MAX : total);
    return 0;
}

void
hw_capture_release(hw_capture_t *cap)
{
    if (cap->frames != cap->local) {
        hw_free(HW_MEM_TRACER, cap->frames);
        cap->frames = cap->local;
    }
}
