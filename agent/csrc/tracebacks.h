/* Traceback capture and interning.
 *
 * A frame is captured as (code object, instruction offset); its line number
 * is resolved when a snapshot needs it, not on every allocation (computing it
 * per allocation is where the stdlib tracer spends most of its time on 3.11+).
 * Identical tracebacks are interned once and shared by all their traces.
 *
 * Lifetime: an interned traceback is in use while live traces (ntraces) or
 * snapshots (pins) refer to it.  Once unused it stays interned, idle, until a
 * sweep: a site that allocates and frees one block per iteration would
 * otherwise free and re-create its traceback every time.  Idle tracebacks are
 * swept when they outnumber the tracebacks in use (and at every drain), so the
 * tracer's memory stays bounded by live traces (plus at most HW_TB_ALLOC_KEEP
 * idle ones kept for their allocation totals).  A traceback owns one strong
 * reference to each code object it names; when it is freed those references go
 * to the graveyard, to be released later with the GIL, because a sweep can run
 * inside a free hook that runs without the GIL or must not run Python code.
 *
 * Frames captured without the GIL (no_code_refs: RAW allocations from threads
 * that released it) cannot take references, so they are resolved at once into
 * a line number and a copy of the filename (a raw name).
 *
 * Everything here except hw_graveyard_drain() expects
 * hw_tables_lock to be held.
 */
#ifndef HEAPWATCH_TRACEBACKS_H
#define HEAPWATCH_TRACEBACKS_H

#include "capture.h"
#include "compat.h"

#define HW_MAX_NFRAME 65535

typedef struct hw_rawname {
    uint64_t hash;
    uint32_t refcnt;   /* frames of interned tracebacks naming it */
    uint32_t kind;     /* PyUnicode kind: bytes per code point */
    uint32_t detached; /* out of the name set (clear_traces): freed by its last frame */
    size_t length;   /* code points */
    char data[];
} hw_rawname_t;

typedef struct hw_traceback {
    uint64_t hash;
    uint64_t size;     /* estimated bytes of the live traces referring to it */
    uint64_t est_blocks; /* estimated number of those traces, in HW_COUNT_ONE units */
    uint32_t ntraces;  /* live traces referring to it */
    uint32_t pins;     /* snapshots referring to it */
    uint32_t pending;  /* queued inserts naming it (tracer.h) */
    uint32_t id;       /* index in the id vector; what a trace slot stores */
    uint32_t domain;
    uint16_t nframe;
    uint16_t total_nframe;
    uint16_t route;    /* routes.h: part of the identity, as the domain */
    uint32_t idle; /* interned but unused, counted in the idle total */
    /* Per-site peak (tracer.h, "Per-site peaks"): size at the last committed
     * peak, valid while peak_gen equals hw_tracer.peak_gen. */
    uint32_t peak_gen;
    uint64_t peak_size;
    /* Allocation totals since tracing started (Go's alloc_space and
     * alloc_objects): every trace added here counts, weighed as the live
     * ones (sampled and scaled in sample mode).  A re-stamp moves a block,
     * it allocates nothing, so it does not count. */
    uint64_t alloc_size;
    uint64_t alloc_blocks; /* HW_COUNT_ONE units */
    hw_frame_t frames[];
    /* followed by int32_t lines[nframe]: see hw_tb_lines() */
} hw_traceback_t;

/* Resolved line of each code frame, -1 until a snapshot resolves it (GIL).
 * Kept out of the frames so that frames compare as plain bytes. */
static inline int32_t *
hw_tb_lines(hw_traceback_t *tb)
{
    return (int32_t *)&tb->frames[tb->nframe];
}

int hw_tb_init_unlocked(void);
/* Drops every traceback, whatever its counts (clear_traces, stop). */
void hw_tb_clear_unlocked(void);
/* Returns the interned traceback for a capture (created with ntraces = pins
 * = 0), or NULL when out of memory. */
hw_traceback_t *hw_tb_intern_unlocked(uint32_t domain, hw_capture_t *cap);
/* Marks tb idle if neither traces, queued inserts nor snapshots refer to it
 * any more (a detached one is freed at once); sweeps when idle ones pile up. */
void hw_tb_unused_unlocked(hw_traceback_t *tb);
/* Whether hw_tb_unused_unlocked(tb) is due, tb having ntraces traces (a
 * caller that just stored the count passes it from its register). */
static inline int
hw_tb_newly_unused(const hw_traceback_t *tb, uint32_t ntraces)
{
    return ntraces == 0 && tb->pins == 0 && tb->pending == 0 && !tb->idle;
}
static inline void
hw_tb_release_if_unused_unlocked(hw_traceback_t *tb)
{
    if (hw_tb_newly_unused(tb, tb->ntraces)) {
        hw_tb_unused_unlocked(tb);
    }
}
/* Idle tracebacks a sweep keeps for their allocation totals alone (those
 * holding a peak are kept anyway).  Past this many, the sweep folds an idle
 * traceback's totals into hw_tb_folded_unlocked() and frees it, so the
 * totals cost at most this many tracebacks beyond the live ones.  The first
 * sites to go idle keep their place: a site that keeps allocating keeps its
 * traceback, and a sweep never sorts. */
#define HW_TB_ALLOC_KEEP 8192

/* What sweeps folded: the totals of the freed tracebacks, and how many. */
typedef struct {
    uint64_t alloc_size;
    uint64_t alloc_blocks; /* HW_COUNT_ONE units */
    uint64_t tracebacks;
} hw_tb_folded_t;
hw_tb_folded_t hw_tb_folded_unlocked(void);

/* Frees every idle traceback but those holding a per-site peak
 * (hw_tb_holds_peak_unlocked, tracer.h): a site that allocated 50 MiB and
 * freed it all must still show 50 MiB until the next peak reset.  Those
 * holding allocation totals are kept up to HW_TB_ALLOC_KEEP. */
void hw_tb_sweep_unlocked(void);
/* Pins tb for a snapshot, idle or not. */
void hw_tb_pin_unlocked(hw_traceback_t *tb);
/* Sets every interned traceback's peak_gen to 0 (the peak generation
 * wrapped around: 0 is never current). */
void hw_tb_peak_stamps_reset_unlocked(void);
hw_traceback_t *hw_tb_by_id_unlocked(uint32_t id);
/* All ids are below this bound. */
uint32_t hw_tb_id_bound_unlocked(void);
/* Interned tracebacks, idle ones included. */
size_t hw_tb_count_unlocked(void);

/* Rewrites the frames of orphaned code objects as raw names and releases
 * the references (see above).  GIL held, hw_tables_lock not held.  Costs one
 * pass over the frames of every interned traceback: snapshots and drain()
 * run it, not the hooks. */
void hw_tb_release_orphans(void);

/* Code references waiting for the GIL. */
size_t hw_graveyard_len_unlocked(void);
/* Sweeps idle tracebacks and releases the references; returns how many.  GIL
 * held, hw_tables_lock not held (a dealloc frees memory through our own hooks). */
size_t hw_graveyard_drain(void);

#endif
