/* Snapshots: what the tracer held at one moment, detached from the tables.
 *
 * Taking one holds hw_tables_lock for a single pass: over the live tracebacks
 * only (per-traceback sums, kept up to date by the hooks) or, when traces are
 * wanted, over the trace tables too.  The tracebacks are pinned, so they and
 * their code objects outlive the traces.  Everything after that pass (line
 * numbers, grouping, sorting) runs with the GIL and without the lock.
 *
 * The C/Python boundary (typed in heapwatch/_core.pyi):
 *   frame      (filename: str, lineno: int)
 *   frames     tuple of frames, most recent first (the stdlib's raw order)
 *   trace      (domain: int, size: int, frames, total_nframe: int)
 *
 * Tracebacks 0 .. ntbs-1 have live traces; ntbs .. ntbs_all-1 have none
 * left but hold a per-site peak (tracer.h): a site that allocated and freed
 * within the interval; ntbs_all .. ntbs_alloc-1 hold neither, only
 * allocation totals (a site that allocated and freed before the interval).
 * Everything that the stdlib's API shows (traces,
 * statistics, the traceback list, masks of ntbs bytes) sees the first ones
 * only.
 */
#ifndef HEAPWATCH_SNAPSHOT_H
#define HEAPWATCH_SNAPSHOT_H

#include "compat.h"
#include "tracebacks.h"

typedef struct {
    uint32_t tb; /* index in the snapshot's tracebacks */
    uint16_t age; /* epochs, at most HW_MAX_AGE */
    uint64_t size;
} hw_snap_trace_t;

/* A resolved frame; filename borrowed from the owner's filename dict. */
typedef struct {
    PyObject *filename;
    int lineno;
} hw_rframe_t;

typedef struct {
    hw_traceback_t **tbs; /* pinned */
    uint64_t *tb_size;    /* estimated bytes per traceback */
    uint64_t *tb_est_blocks;
    uint64_t *tb_peak;    /* estimated bytes in the interval's peak state */
    uint32_t ntbs;        /* tracebacks with live traces */
    uint32_t ntbs_all;    /* and those holding only a peak */
    uint32_t ntbs_alloc;  /* and those holding only allocation totals */
    uint64_t *tb_alloc_size;   /* allocation totals per traceback (tracebacks.h) */
    uint64_t *tb_alloc_blocks;
    hw_tb_folded_t alloc_folded; /* totals of the tracebacks swept (HW_TB_ALLOC_KEEP) */
    hw_snap_trace_t *traces; /* NULL unless taken with traces */
    size_t ntraces;
    int traceback_limit;
    int mode;
    uint64_t sample_interval;
    uint64_t traced;
    uint64_t peak;
    uint64_t est_blocks;
    uint32_t epoch; /* the age epoch when taken */
    /* Resolution, GIL. */
    PyObject *filenames; /* dict: canonical filename objects */
    hw_rframe_t *rframes; /* flat: frames of traceback i start at rf_off[i] */
    size_t *rf_off;
    uint16_t *resolved; /* frames of traceback i resolved so far */
} hw_snapshot_t;

/* GIL held.  NULL with an exception set.  With reset_peak, the peak is reset
 * to the current size in the same critical section, so no peak between the
 * snapshot and the reset is lost (the agent's "peak during the interval"). */
hw_snapshot_t *hw_snapshot_take(int with_traces, int reset_peak);
/* GIL held. */
void hw_snapshot_free(hw_snapshot_t *snap);
/* Resolves the first `need` frames of traceback i.  -1 with an exception. */
int hw_snapshot_resolve(hw_snapshot_t *snap, uint32_t i, int need);
static inline hw_rframe_t *
hw_snapshot_rframes(hw_snapshot_t *snap, uint32_t i)
{
    return &snap->rframes[snap->rf_off[i]];
}

/* Resolves frame i of a pinned traceback (caching its line); filename
 * canonicalised through `filenames` when not NULL.  Returns a new reference
 * to the filename. */
PyObject *hw_frame_resolve(hw_traceback_t *tb, int i, PyObject *filenames, int *lineno);
/* A new frames tuple for n resolved frames. */
PyObject *hw_rframes_to_tuple(const hw_rframe_t *frames, int n);

#endif
