#include "snapshot.h"

#include <string.h>

#include "lifecycle.h"
#include "mem.h"
#include "sync.h"
#include "tracer.h"

static PyObject *
unknown_filename(void)
{
    static PyObject *unknown; /* immortal for the process; GIL */
    if (unknown == NULL) {
        unknown = PyUnicode_InternFromString("<unknown>");
    }
    Py_XINCREF(unknown);
    return unknown;
}

PyObject *
hw_frame_resolve(hw_traceback_t *tb, int i, PyObject *filenames, int *lineno)
{
    const hw_frame_t *frame = &tb->frames[i];
    PyObject *name;
    if (frame->key == 0) {
        *lineno = (int)frame->lasti;
        name = unknown_filename();
    }
    else if (frame->key & HW_FRAME_RAW) {
        hw_rawname_t *raw = (hw_rawname_t *)(frame->key & ~HW_FRAME_RAW);
        *lineno = (int)frame->lasti;
        name = PyUnicode_FromKindAndData((int)raw->kind, raw->data, (Py_ssize_t)raw->length);
    }
    else {
        PyCodeObject *code = (PyCodeObject *)frame->key;
        int32_t *cached = &hw_tb_lines(tb)[i];
        if (*cached < 0) {
            int line = PyCode_Addr2Line(code, (int)frame->lasti);
            *cached = line < 0 ? 0 : line;
        }
        *lineno = *cached;
        if (code->co_filename != NULL && PyUnicode_Check(code->co_filename)) {
            name = Py_NewRef(code->co_filename);
        }
        else {
            name = unknown_filename();
        }
    }
    if (name == NULL || filenames == NULL) {
        return name;
    }
    PyObject *canonical = PyDict_SetDefault(filenames, name, name);
    Py_XINCREF(canonical);
    Py_DECREF(name);
    return canonical;
}

PyObject *
hw_rframes_to_tuple(const hw_rframe_t *frames, int n)
{
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        PyObject *frame = Py_BuildValue("(Oi)", frames[i].filename, frames[i].lineno);
        if (frame == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, frame);
    }
    return tuple;
}

int
hw_snapshot_resolve(hw_snapshot_t *snap, uint32_t i, int need)
{
    hw_traceback_t *tb = snap->tbs[i];
    if (need > tb->nframe) {
        need = tb->nframe;
    }
    hw_rframe_t *out = hw_snapshot_rframes(snap, i);
    for (int j = snap->resolved[i]; j < need; j++) {
        int lineno;
        PyObject *name = hw_frame_resolve(tb, j, snap->filenames, &lineno);
        if (name == NULL) {
            return -1;
        }
        /* The dict keeps the canonical object alive. */
        out[j].filename = name;
        out[j].lineno = lineno;
        Py_DECREF(name);
        snap->resolved[i] = (uint16_t)(j + 1);
    }
    return 0;
}

static void
unpin_unlocked(hw_snapshot_t *snap)
{
    for (uint32_t i = 0; i < snap->ntbs_alloc; i++) {
        snap->tbs[i]->pins--;
        hw_tb_release_if_unused_unlocked(snap->tbs[i]);
    }
}

void
hw_snapshot_free(hw_snapshot_t *snap)
{
    if (snap == NULL) {
        return;
    }
    if (snap->tbs != NULL) {
        hw_lock();
        unpin_unlocked(snap);
        hw_unlock();
    }
    hw_free(HW_MEM_SNAPSHOT, snap->tbs);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_size);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_est_blocks);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_peak);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_alloc_size);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_alloc_blocks);
    hw_free(HW_MEM_SNAPSHOT, snap->traces);
    hw_free(HW_MEM_SNAPSHOT, snap->rframes);
    hw_free(HW_MEM_SNAPSHOT, snap->rf_off);
    hw_free(HW_MEM_SNAPSHOT, snap->resolved);
    Py_XDECREF(snap->filenames);
    hw_free(HW_MEM_SNAPSHOT, snap);
    hw_graveyard_drain();
}

/* Copies live trace slots of one table; hw_tables_lock held. */
static size_t
copy_traces_unlocked(const hw_traces_t *table, const uint32_t *local, hw_snap_trace_t *out,
                     size_t room)
{
    size_t n = 0;
    for (size_t i = 0; i <= table->mask && n < room; i++) {
        const hw_slot_t *slot = &table->slots[i];
        if (slot->ptr != 0) {
            out[n].tb = local[slot->tb] - 1;
            out[n].age = (uint16_t)hw_traces_slot_age_unlocked(slot);
            out[n].size = hw_traces_slot_size_unlocked(table, slot);
            n++;
        }
    }
    return n;
}

/* The pass under the lock.  Returns -1 when the room reserved without the
 * lock is short (other threads added tracebacks or traces): retry. */
static int
take_unlocked(hw_snapshot_t *snap, int with_traces, uint32_t *local, size_t local_len,
              size_t tb_room, size_t trace_room)
{
    hw_flush_unlocked();
    uint32_t bound = hw_tb_id_bound_unlocked();
    if (bound > local_len) {
        return -1;
    }
    uint32_t k = 0;
    /* Live tracebacks first, then those holding only a peak, then those
     * holding only allocation totals. */
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) {
            snap->ntbs = k;
        }
        if (pass == 2) {
            snap->ntbs_all = k;
        }
        for (uint32_t id = 1; id < bound; id++) {
            hw_traceback_t *tb = hw_tb_by_id_unlocked(id);
            if (tb == NULL || (tb->ntraces == 0) != (pass != 0)) {
                continue;
            }
            uint64_t peak = hw_tb_peak_unlocked(tb);
            if ((pass == 1 && peak == 0) || (pass == 2 && (peak != 0 || tb->alloc_blocks == 0))) {
                continue;
            }
            if (k == tb_room) {
                return -1;
            }
            snap->tbs[k] = tb;
            snap->tb_size[k] = tb->size;
            snap->tb_est_blocks[k] = tb->est_blocks;
            snap->tb_peak[k] = peak;
            snap->tb_alloc_size[k] = tb->alloc_size;
            snap->tb_alloc_blocks[k] = tb->alloc_blocks;
            local[id] = ++k;
        }
    }
    size_t ntraces = __atomic_load_n(&hw_tracer.ntraces, __ATOMIC_RELAXED);
    if (with_traces && ntraces > trace_room) {
        return -1;
    }
    for (uint32_t i = 0; i < k; i++) {
        hw_tb_pin_unlocked(snap->tbs[i]);
    }
    snap->ntbs_alloc = k;
    snap->alloc_folded = hw_tb_folded_unlocked();
    if (with_traces) {
        size_t n = copy_traces_unlocked(&hw_tracer.traces, local, snap->traces, trace_room);
        for (size_t d = 0; d < hw_tracer.ndomains; d++) {
            n += copy_traces_unlocked(&hw_tracer.domains[d].traces, local, snap->traces + n,
                                      trace_room - n);
        }
        snap->ntraces = n;
    }
    snap->traceback_limit = hw_tracer.max_nframe;
    snap->mode = hw_tracer.mode;
    /* What the traces were sampled at: none in exact mode, whatever start()
     * was given (a dump of an exact snapshot refuses anything but 0). */
    snap->sample_interval = hw_tracer.mode == HW_MODE_SAMPLE ? hw_tracer.sample_interval : 0;
    snap->traced = hw_tracer.traced;
    snap->peak = hw_tracer.peak;
    snap->est_blocks = hw_tracer.est_blocks;
    snap->epoch = hw_traces_epoch_unlocked();
    return 0;
}

/* Allocates, without the lock, room for what take_unlocked() will copy. */
static int
reserve(hw_snapshot_t *snap, uint32_t **local, size_t *local_len, size_t *tb_room,
        size_t *trace_room, int with_traces)
{
    hw_free(HW_MEM_SNAPSHOT, *local);
    hw_free(HW_MEM_SNAPSHOT, snap->tbs);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_size);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_est_blocks);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_peak);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_alloc_size);
    hw_free(HW_MEM_SNAPSHOT, snap->tb_alloc_blocks);
    hw_free(HW_MEM_SNAPSHOT, snap->traces);
    snap->tbs = NULL;
    snap->tb_size = snap->tb_est_blocks = snap->tb_peak = NULL;
    snap->tb_alloc_size = snap->tb_alloc_blocks = NULL;
    snap->traces = NULL;
    hw_lock();
    uint32_t bound = hw_tb_id_bound_unlocked();
    size_t ntbs = hw_tb_count_unlocked();
    hw_unlock();
    size_t ntraces = __atomic_load_n(&hw_tracer.ntraces, __ATOMIC_RELAXED);
    /* Slack for what other threads add before we take the lock again. */
    *tb_room = ntbs + ntbs / 8 + 64;
    *trace_room = with_traces ? ntraces + ntraces / 8 + 1024 : 0;
    *local_len = (size_t)bound + *tb_room;
    *local = hw_calloc(HW_MEM_SNAPSHOT, *local_len, sizeof(uint32_t));
    snap->tbs = hw_malloc(HW_MEM_SNAPSHOT, *tb_room * sizeof(hw_traceback_t *));
    snap->tb_size = hw_malloc(HW_MEM_SNAPSHOT, *tb_room * sizeof(uint64_t));
    snap->tb_est_blocks = hw_malloc(HW_MEM_SNAPSHOT, *tb_room * sizeof(uint64_t));
    snap->tb_peak = hw_malloc(HW_MEM_SNAPSHOT, *tb_room * sizeof(uint64_t));
    snap->tb_alloc_size = hw_malloc(HW_MEM_SNAPSHOT, *tb_room * sizeof(uint64_t));
    snap->tb_alloc_blocks = hw_malloc(HW_MEM_SNAPSHOT, *tb_room * sizeof(uint64_t));
    if (with_traces) {
        snap->traces = hw_malloc(HW_MEM_SNAPSHOT, *trace_room * sizeof(hw_snap_trace_t));
    }
    if (*local == NULL || snap->tbs == NULL || snap->tb_size == NULL || snap->tb_est_blocks == NULL ||
        snap->tb_peak == NULL || snap->tb_alloc_size == NULL || snap->tb_alloc_blocks == NULL ||
        (with_traces && snap->traces == NULL)) {
        return -1;
    }
    return 0;
}

hw_snapshot_t *
hw_snapshot_take(int with_traces, int reset_peak)
{
    hw_housekeeping();
    hw_snapshot_t *snap = hw_calloc(HW_MEM_SNAPSHOT, 1, sizeof(*snap));
    if (snap == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    uint32_t *local = NULL;
    size_t local_len = 0, tb_room = 0, trace_room = 0;
    for (;;) {
        if (reserve(snap, &local, &local_len, &tb_room, &trace_room, with_traces) < 0) {
            goto nomem;
        }
        hw_lock();
        if (!hw_tracer.tracing) {
            hw_unlock();
            hw_free(HW_MEM_SNAPSHOT, local);
            hw_snapshot_free(snap);
            PyErr_SetString(PyExc_RuntimeError,
                            "the tracemalloc module must be tracing memory allocations to take "
                            "a snapshot");
            return NULL;
        }
        int ok = take_unlocked(snap, with_traces, local, local_len, tb_room, trace_room);
        if (ok == 0 && reset_peak) {
            hw_tracer.peak = hw_tracer.traced;
            hw_peak_commit_unlocked();
        }
        hw_unlock();
        if (ok == 0) {
            break;
        }
    }
    hw_free(HW_MEM_SNAPSHOT, local);
    size_t nframes = 0;
    snap->rf_off = hw_malloc(HW_MEM_SNAPSHOT, ((size_t)snap->ntbs_alloc + 1) * sizeof(size_t));
    snap->resolved = hw_calloc(HW_MEM_SNAPSHOT, (size_t)snap->ntbs_alloc + 1, sizeof(uint16_t));
    if (snap->rf_off == NULL || snap->resolved == NULL) {
        goto nomem;
    }
    for (uint32_t i = 0; i < snap->ntbs_alloc; i++) {
        snap->rf_off[i] = nframes;
        nframes += snap->tbs[i]->nframe;
    }
    snap->rf_off[snap->ntbs_alloc] = nframes;
    snap->rframes = hw_malloc(HW_MEM_SNAPSHOT, (nframes + 1) * sizeof(hw_rframe_t));
    snap->filenames = PyDict_New();
    if (snap->rframes == NULL || snap->filenames == NULL) {
        goto nomem;
    }
    return snap;

nomem:
    hw_free(HW_MEM_SNAPSHOT, local);
    hw_snapshot_free(snap);
    PyErr_NoMemory();
    return NULL;
}
