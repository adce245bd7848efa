#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "capture.h"

#include <stddef.h>
#include <string.h>

#include "mem.h"
#include "thread.h"

/* Frames walked link by link before the memo takes over: on shallow stacks
 * the walk costs less than the memo's lookup and bookkeeping. */
#define PLAIN_STEPS 4

/* From 3.12, where some frames do not count in total_nframe (the
 * interpreter's entry frames and the __init__ trampoline), the memo also
 * keeps, at each position, how many frames below it count, so that a chain
 * proven unchanged is not read again for its depth.  Whether a frame counts
 * is known from its place and what it runs: the entry frames live on the
 * thread's C stack (and 3.15's base frame in its thread state), where no
 * other frame is ever put while that thread state lives; the trampoline
 * runs its own code object.  So each entry keeps its frame's executable
 * too, an entry is trusted only when both its link and its executable are
 * as recorded, and the memo is forgotten when the thread state changes. */
#if !HW_EVERY_FRAME_COUNTS
#  define HW_COUNT_MEMO 1
#else
#  define HW_COUNT_MEMO 0
#  define HW_FRAME_EXECUTABLE_OFFSET 0
#endif

/* Deeper stacks are walked frame by frame, without a memo. */
#define MEMO_MAX_DEPTH (1u << 16)
#define MEMO_MIN_CAP 64u

typedef struct hw_memo {
    /* Outermost frame first.  Entries [0, written) were filled by some walk;
     * those past the current stack's depth are stale, and harmless: an entry
     * is trusted only once the live chain has reached it. */
    hw_pyframe_t **chain;
    hw_pyframe_t **scratch; /* frames walked by the current capture, innermost first */
#if HW_COUNT_MEMO
    uintptr_t *executables; /* chain[p]'s executable (hw_frame_executable_bits) */
    uint32_t *counted;      /* how many of chain[0, p) count; cap + 1 entries */
    /* counted[0, counted_upto] were found on the entries now below them;
     * past it, on entries since rewritten. */
    uint32_t counted_upto;
    PyThreadState *tstate; /* the thread state the entries were walked in */
#endif
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

/* Whether chain[pos] is frame (a live frame) as recorded: the same place
 * and, from 3.12, the same executable (another frame at the same place is as
 * good as unknown). */
static inline int
memo_holds(const memo_t *memo, uint32_t pos, const hw_pyframe_t *frame)
{
    return memo->chain[pos] == frame
#if HW_COUNT_MEMO
           && memo->executables[pos] == hw_frame_executable_bits(frame)
#endif
        ;
}

/* The position of frame in the chain, if the index knows it.  A direct-mapped
 * index: a collision only costs a frame that is walked instead of verified. */
static inline int
memo_find(const memo_t *memo, const hw_pyframe_t *frame, uint32_t *pos)
{
    uint32_t entry = memo->index[memo_slot(memo, frame)];
    if (entry == 0 || entry > memo->written || !memo_holds(memo, entry - 1, frame)) {
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
#if HW_COUNT_MEMO
    hw_free(HW_MEM_TRACER, memo->executables);
    hw_free(HW_MEM_TRACER, memo->counted);
#endif
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
#if HW_COUNT_MEMO
    uintptr_t *executables =
        hw_realloc(HW_MEM_TRACER, memo->executables, cap * sizeof(*executables));
    if (executables == NULL) {
        return -1;
    }
    memo->executables = executables;
    uint32_t *counted =
        hw_realloc(HW_MEM_TRACER, memo->counted, ((size_t)cap + 1) * sizeof(*counted));
    if (counted == NULL) {
        return -1;
    }
    memo->counted = counted;
#endif
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

/* A memo for the frames of tstate. */
static HW_COLD memo_t *
memo_create(PyThreadState *tstate)
{
    memo_t *memo = hw_calloc(HW_MEM_TRACER, 1, sizeof(*memo));
    if (memo == NULL) {
        return NULL;
    }
#if HW_COUNT_MEMO
    memo->tstate = tstate;
#else
    (void)tstate;
#endif
    memo->cap = MEMO_MIN_CAP;
    memo->chain = hw_malloc(HW_MEM_TRACER, MEMO_MIN_CAP * sizeof(*memo->chain));
    memo->scratch = hw_malloc(HW_MEM_TRACER, MEMO_MIN_CAP * sizeof(*memo->scratch));
    memo->index = hw_calloc(HW_MEM_TRACER, 2 * MEMO_MIN_CAP, sizeof(*memo->index));
    memo->index_shift = index_shift(MEMO_MIN_CAP);
#if HW_COUNT_MEMO
    memo->executables = hw_malloc(HW_MEM_TRACER, MEMO_MIN_CAP * sizeof(*memo->executables));
    memo->counted = hw_calloc(HW_MEM_TRACER, MEMO_MIN_CAP + 1, sizeof(*memo->counted));
    if (memo->executables == NULL || memo->counted == NULL) {
        hw_memo_free(memo);
        return NULL;
    }
#endif
    if (memo->chain == NULL || memo->scratch == NULL || memo->index == NULL) {
        hw_memo_free(memo);
        return NULL;
    }
    return memo;
}

/* Notes the executables of chain[from, to), entries just written, and
 * that the counts from from up are to be found again. */
static inline void
memo_wrote(memo_t *memo, uint32_t from, uint32_t to)
{
#if HW_COUNT_MEMO
    for (uint32_t p = from; p < to; p++) {
        memo->executables[p] = hw_frame_executable_bits(memo->chain[p]);
    }
    if (memo->counted_upto > from) {
        memo->counted_upto = from;
    }
#else
    (void)memo;
    (void)from;
    (void)to;
#endif
}

/* chain[0, depth) proven live: makes counted[0, depth] hold. */
static inline void
memo_count(memo_t *memo, uint32_t depth)
{
#if HW_COUNT_MEMO
    for (uint32_t p = memo->counted_upto; p < depth; p++) {
        memo->counted[p + 1] = memo->counted[p] + (uint32_t)hw_frame_counts_below(memo->chain[p]);
    }
    if (memo->counted_upto < depth) {
        memo->counted_upto = depth;
    }
#else
    (void)memo;
    (void)depth;
#endif
}

/* How many of chain[0, n) count: a live chain, counted (memo_count). */
static inline uint32_t
memo_counted_below(const memo_t *memo, uint32_t n)
{
#if HW_COUNT_MEMO
    return memo->counted[n];
#else
    (void)memo;
    return n; /* HW_EVERY_FRAME_COUNTS */
#endif
}

/* Continues a capture down chain[depth - 1] (innermost) .. chain[0], a
 * proven chain: records (code, offset) of frames that count until
 * max_nframe are recorded, and counts the rest. */
static inline void
capture_from_chain(hw_capture_t *cap, uint32_t *total, memo_t *memo, uint32_t depth,
                   int max_nframe)
{
    memo_count(memo, depth);
    hw_pyframe_t *const *chain = memo->chain;
    if (cap->nframe >= max_nframe) {
        *total += memo_counted_below(memo, depth); /* captured enough already */
        return;
    }
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
    *total += captured + memo_counted_below(memo, (uint32_t)(next - chain));
    cap->nframe = (int)(out - cap->frames);
}

/* Verifies the memo's chain from *live (a live frame) down: returns the
 * lowest entry proven live, each one by the link of the entry above it and,
 * from 3.12, by its executable as recorded (HW_COUNT_MEMO).  Every link is
 * read at an address taken from the memo, not from the link just found
 * equal to it, so that the reads do not wait for one another; and a frame
 * is read only once proven live, since a stale entry may point into freed
 * memory.  In assembly on x86-64: a compiler that sees a link equal to the
 * next entry may read the next frame through the link, which chains the
 * reads again (it did). */
static inline hw_pyframe_t **
verify_links(const memo_t *memo, hw_pyframe_t **live)
{
    hw_pyframe_t **bottom = memo->chain;
#if defined(__x86_64__)
    /* Three instructions a link: load the entry below, compare it with the
     * link read through the entry above, branch; from 3.12 three more to
     * compare the frame's executable with the one recorded, read at the
     * same distance from executables as the entry is from chain (the frame
     * is read once its link proved it live, and its executable sits beside
     * its link).  Eight links a round; the last 0 to 7 links enter a round
     * part-way (a jump table), as if it started 8 entries above the bottom. */
#  if HW_COUNT_MEMO
#    define CHECK_EXECUTABLE(disp, reg, mismatch)                                                \
        "mov " disp "(%[live],%[distance]), %[executable]\n\t"                                  \
        "cmp %c[xoff](%[" reg "]), %[executable]\n\t"                                          \
        "jne " mismatch "\n\t"
    intptr_t distance = (intptr_t)((uintptr_t)memo->executables - (uintptr_t)memo->chain);
#  else
#    define CHECK_EXECUTABLE(disp, reg, mismatch) ""
    intptr_t distance = 0;
#  endif
    hw_pyframe_t *above = *live;
    hw_pyframe_t *next;
    uintptr_t tmp;
    uintptr_t table;
    uintptr_t executable;
    __asm__("cmp %[limit], %[live]\n\t"
            "jb 3f\n"
            "1:\n\t"
            "mov -8(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 4f\n\t"
            CHECK_EXECUTABLE("-8", "next", "4f")
            "22:\n\t"
            "mov -16(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 11f\n\t"
            CHECK_EXECUTABLE("-16", "above", "11f")
            "23:\n\t"
            "mov -24(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 12f\n\t"
            CHECK_EXECUTABLE("-24", "next", "12f")
            "24:\n\t"
            "mov -32(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 13f\n\t"
            CHECK_EXECUTABLE("-32", "above", "13f")
            "25:\n\t"
            "mov -40(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 14f\n\t"
            CHECK_EXECUTABLE("-40", "next", "14f")
            "26:\n\t"
            "mov -48(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 15f\n\t"
            CHECK_EXECUTABLE("-48", "above", "15f")
            "27:\n\t"
            "mov -56(%[live]), %[next]\n\t"
            "cmp %c[off](%[above]), %[next]\n\t"
            "jne 16f\n\t"
            CHECK_EXECUTABLE("-56", "next", "16f")
            "28:\n\t"
            "mov -64(%[live]), %[above]\n\t"
            "cmp %c[off](%[next]), %[above]\n\t"
            "jne 17f\n\t"
            CHECK_EXECUTABLE("-64", "above", "17f")
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
              [table] "=&r"(table), [executable] "=&r"(executable)
            : [bottom] "r"(bottom), [limit] "r"(bottom + 8), [off] "i"(HW_FRAME_BACK_OFFSET),
              [distance] "r"(distance), [xoff] "i"(HW_FRAME_EXECUTABLE_OFFSET)
            : "cc", "memory");
#  undef CHECK_EXECUTABLE
    (void)executable;
    return live;
#else
    while (live > bottom && hw_frame_back(*live) == live[-1]) {
#  if HW_COUNT_MEMO
        if (hw_frame_executable_bits(live[-1]) != memo->executables[live - 1 - bottom]) {
            break;
        }
#  endif
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
        hw_pyframe_t **live = verify_links(memo, &memo->chain[pos]);
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
        capture_from_chain(cap, total, memo, pos + 1, max_nframe);
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
        memo_wrote(memo, ntail, ntail + kept);
    }
    for (uint32_t p = 0; p < ntail; p++) {
        chain[p] = memo->scratch[nfresh + ntail - 1 - p];
        memo_note(memo, p);
    }
    memo_wrote(memo, 0, ntail);
    for (uint32_t p = ntail + kept; p < depth; p++) {
        chain[p] = memo->scratch[depth - 1 - p];
        memo_note(memo, p);
    }
    memo_wrote(memo, ntail + kept, depth);
    if (depth > memo->written) {
        memo->written = depth;
    }
    capture_from_chain(cap, total, memo, depth, max_nframe);
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

/* The agent's profile: keeps the frames that count from frame down until
 * max_nframe are kept, then looks no further than the next frame that
 * counts.  The memo is for the whole depth, which this does not need. */
static inline uint32_t
walk_kept(hw_capture_t *cap, hw_pyframe_t *frame, int max_nframe)
{
    hw_frame_t *out = cap->frames;
    hw_frame_t *const end = cap->frames + max_nframe;
    for (; frame != NULL; frame = hw_frame_back(frame)) {
        if (!hw_frame_counts_below(frame)) {
            continue;
        }
        if (out == end) {
            break; /* one more frame counts: truncated */
        }
        PyCodeObject *code = hw_frame_code(frame);
        out->key = (uintptr_t)code;
        out->lasti = hw_frame_lasti(frame, code);
        out++;
    }
    cap->nframe = (int)(out - cap->frames);
    return (uint32_t)cap->nframe + (frame != NULL);
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
    memo_wrote(memo, depth, depth + PLAIN_STEPS);
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
    if (!memo_holds(memo, memo->last_depth - 1, top)) {
        return 0;
    }
    if (verify_links(memo, innermost) != chain || hw_frame_back(chain[0]) != NULL) {
        return 0;
    }
    capture_from_chain(cap, total, memo, memo->last_depth, max_nframe);
    return 1;
}

int
hw_capture(hw_capture_t *cap, PyThreadState *tstate, int no_code_refs, int max_nframe,
           int count_depth)
{
    cap->frames = cap->local;
    cap->nframe = 0;
    cap->total_nframe = 0;
    cap->route = 0;
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
    /* Created whatever the profile: it holds the traceback cache too. */
    hw_thread_t *thread = hw_thread();
    if (!count_depth) {
        total = walk_kept(cap, frame, max_nframe);
        cap->total_nframe = (uint16_t)(total > UINT16_MAX ? UINT16_MAX : total);
        return 0;
    }
    memo_t *memo = thread != NULL ? thread->memo : NULL;
#if HW_COUNT_MEMO
    if (memo != NULL && HW_UNLIKELY(memo->tstate != tstate)) {
        /* Another thread state on this thread (a sub-interpreter's, or a
         * library's that swaps them): its frames' places mean other things. */
        memo->tstate = tstate;
        memo->written = 0;
        memo->last_depth = 0;
        memo->counted_upto = 0;
    }
#endif
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
        if (HW_UNLIKELY(memo == NULL) && thread != NULL) {
            memo = thread->memo = memo_create(tstate);
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
