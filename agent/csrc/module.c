/* heapwatch._core: the binding.  It parses arguments, converts results to
 * the tuples documented in snapshot.h and groups.h, and owns the Snapshot and
 * Groups types.  The engine lives in the other files. */
#include "compat.h"

#include <errno.h>
#include <string.h>

#include "descriptors.h"
#include "groups.h"
#include "hooks.h"
#include "interpose.h"
#include "lifecycle.h"
#include "mem.h"
#include "nativeheap.h"
#include "reftracer.h"
#include "snapshot.h"
#include "sync.h"
#include "tracer.h"
#include "routes.h"
#include "wake.h"

static const char *const mode_names[] = {"exact", "sample"};
/* By HW_PROFILE_*: what start(profile=) takes and get_config() says. */
static const char *const profile_names[] = {"tracemalloc", "agent"};

/* HW_PROFILE_* named by name, or -1 with ValueError. */
static int
profile_number(PyObject *name)
{
    for (int i = 0; i < (int)(sizeof(profile_names) / sizeof(*profile_names)); i++) {
        if (PyUnicode_CompareWithASCIIString(name, profile_names[i]) == 0) {
            return i;
        }
    }
    PyErr_Format(PyExc_ValueError, "profile must be '%s' or '%s', got %R", profile_names[0],
                 profile_names[1], name);
    return -1;
}

/* ---- Groups ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    hw_groups_t *groups;
} GroupsObject;

static PyTypeObject Groups_Type;

static void
Groups_dealloc(GroupsObject *self)
{
    hw_groups_free(self->groups);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
parse_limit(PyObject *obj, Py_ssize_t *limit)
{
    if (obj == NULL || obj == Py_None) {
        *limit = -1;
        return 0;
    }
    *limit = PyLong_AsSsize_t(obj);
    if (*limit == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*limit < 0) {
        PyErr_Format(PyExc_ValueError, "limit must be None or >= 0, got %zd", *limit);
        return -1;
    }
    return 0;
}

static PyObject *
Groups_statistics(GroupsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"limit", NULL};
    PyObject *limit_obj = NULL;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:statistics", kwlist, &limit_obj) ||
        parse_limit(limit_obj, &limit) < 0) {
        return NULL;
    }
    return hw_groups_statistics(self->groups, limit);
}

static PyObject *
Groups_compare(GroupsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"old", "limit", NULL};
    GroupsObject *old;
    PyObject *limit_obj = NULL;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|O:compare", kwlist, &Groups_Type, &old,
                                     &limit_obj) ||
        parse_limit(limit_obj, &limit) < 0) {
        return NULL;
    }
    return hw_groups_compare(self->groups, old->groups, limit);
}

static PyObject *
Groups_growth(GroupsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"old", "limit", NULL};
    PyObject *old;
    PyObject *limit_obj = NULL;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:growth", kwlist, &old, &limit_obj) ||
        parse_limit(limit_obj, &limit) < 0) {
        return NULL;
    }
    if (old != Py_None && !PyObject_TypeCheck(old, &Groups_Type)) {
        PyErr_Format(PyExc_TypeError, "old must be Groups or None, not %.100s",
                     Py_TYPE(old)->tp_name);
        return NULL;
    }
    hw_groups_t *prev = old == Py_None ? NULL : ((GroupsObject *)old)->groups;
    return hw_groups_growth(self->groups, prev, limit);
}

static PyObject *
Groups_peaks(GroupsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"limit", NULL};
    PyObject *limit_obj = NULL;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:peaks", kwlist, &limit_obj) ||
        parse_limit(limit_obj, &limit) < 0) {
        return NULL;
    }
    return hw_groups_peaks(self->groups, limit);
}

static PyObject *
Groups_ages(GroupsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"limit", NULL};
    PyObject *limit_obj = NULL;
    Py_ssize_t limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:ages", kwlist, &limit_obj) ||
        parse_limit(limit_obj, &limit) < 0) {
        return NULL;
    }
    return hw_groups_ages(self->groups, limit);
}

static PyObject *
Groups_get_peak(GroupsObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->groups->total_peak);
}

static PyObject *
Groups_get_total(GroupsObject *self, void *closure)
{
    (void)closure;
    return Py_BuildValue("(KK)", (unsigned long long)self->groups->total_size,
                         (unsigned long long)hw_count_round(self->groups->total_est_blocks));
}

static Py_ssize_t
Groups_len(GroupsObject *self)
{
    return (Py_ssize_t)self->groups->nlive;
}

static PyMethodDef Groups_methods[] = {
    {"statistics", (PyCFunction)(void (*)(void))Groups_statistics, METH_VARARGS | METH_KEYWORDS,
     "statistics(limit=None) -> list of (frames, size, count), in the stdlib's order."},
    {"compare", (PyCFunction)(void (*)(void))Groups_compare, METH_VARARGS | METH_KEYWORDS,
     "compare(old, limit=None) -> list of (frames, size, size_diff, count, count_diff)."},
    {"growth", (PyCFunction)(void (*)(void))Groups_growth, METH_VARARGS | METH_KEYWORDS,
     "growth(old, limit=None) -> the first statistics, with their differences from old."},
    {"peaks", (PyCFunction)(void (*)(void))Groups_peaks, METH_VARARGS | METH_KEYWORDS,
     "peaks(limit=None) -> list of (frames, size, count, peak), by peak: each group's bytes in "
     "the state where the traced total reached its peak, sites with no live trace left included."},
    {"ages", (PyCFunction)(void (*)(void))Groups_ages, METH_VARARGS | METH_KEYWORDS,
     "ages(limit=None) -> list of (frames, size, count, histogram) in statistics order; "
     "histogram: bytes by age in epochs, bucket 0 for age 0, bucket b for [2**(b-1), 2**b)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Groups_getset[] = {
    {"total", (getter)Groups_get_total, NULL, "(size, count) over every group's traces", NULL},
    {"peak", (getter)Groups_get_peak, NULL, "the sum of the groups' peaks", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Groups_as_sequence = {
    .sq_length = (lenfunc)Groups_len,
};

static PyTypeObject Groups_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "heapwatch._core.Groups",
    .tp_basicsize = sizeof(GroupsObject),
    .tp_dealloc = (destructor)Groups_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A snapshot's statistics grouped in C (Snapshot.group()).",
    .tp_methods = Groups_methods,
    .tp_getset = Groups_getset,
    .tp_as_sequence = &Groups_as_sequence,
};

/* ---- Snapshot ---------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    hw_snapshot_t *snap;
    PyObject *tb_tuples; /* list: frames tuple per traceback, None until built */
} SnapshotObject;

static PyTypeObject Snapshot_Type;

static void
Snapshot_dealloc(SnapshotObject *self)
{
    Py_XDECREF(self->tb_tuples);
    hw_snapshot_free(self->snap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Frames tuple of traceback i, built once per snapshot and shared. */
static PyObject *
tb_tuple(SnapshotObject *self, uint32_t i)
{
    hw_snapshot_t *snap = self->snap;
    if (self->tb_tuples == NULL) {
        self->tb_tuples = PyList_New((Py_ssize_t)snap->ntbs_alloc);
        if (self->tb_tuples == NULL) {
            return NULL;
        }
        for (uint32_t k = 0; k < snap->ntbs_alloc; k++) {
            PyList_SET_ITEM(self->tb_tuples, k, Py_NewRef(Py_None));
        }
    }
    PyObject *cached = PyList_GET_ITEM(self->tb_tuples, i);
    if (cached != Py_None) {
        return Py_NewRef(cached);
    }
    hw_traceback_t *tb = snap->tbs[i];
    if (hw_snapshot_resolve(snap, i, tb->nframe) < 0) {
        return NULL;
    }
    PyObject *frames = hw_rframes_to_tuple(hw_snapshot_rframes(snap, i), tb->nframe);
    if (frames == NULL) {
        return NULL;
    }
    PyList_SetItem(self->tb_tuples, i, Py_NewRef(frames));
    return frames;
}

/* Checks a per-traceback mask argument; NULL mask for None.  One byte per
 * traceback of tracebacks() (those holding only a peak are then kept), or of
 * tracebacks(peaks=True). */
static int
parse_mask(SnapshotObject *self, PyObject *mask_obj, const unsigned char **mask, size_t *len)
{
    *mask = NULL;
    *len = 0;
    if (mask_obj == NULL || mask_obj == Py_None) {
        return 0;
    }
    Py_ssize_t n = PyBytes_Check(mask_obj) ? PyBytes_GET_SIZE(mask_obj) : -1;
    if (n != (Py_ssize_t)self->snap->ntbs && n != (Py_ssize_t)self->snap->ntbs_all) {
        PyErr_Format(PyExc_ValueError,
                     "mask must be None or bytes with one byte per traceback (%u, or %u with "
                     "those holding only a peak)",
                     self->snap->ntbs, self->snap->ntbs_all);
        return -1;
    }
    *mask = (const unsigned char *)PyBytes_AS_STRING(mask_obj);
    *len = (size_t)n;
    return 0;
}

static PyObject *
Snapshot_traces(SnapshotObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"mask", "ages", NULL};
    PyObject *mask_obj = NULL;
    int ages = 0;
    const unsigned char *mask;
    size_t mask_len;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Op:traces", kwlist, &mask_obj, &ages) ||
        parse_mask(self, mask_obj, &mask, &mask_len) < 0) {
        return NULL;
    }
    hw_snapshot_t *snap = self->snap;
    if (snap->traces == NULL) {
        PyErr_SetString(PyExc_ValueError, "this snapshot was taken without traces (traces=False)");
        return NULL;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) {
        return NULL;
    }
    for (size_t k = 0; k < snap->ntraces; k++) {
        uint32_t i = snap->traces[k].tb;
        if (mask != NULL && !mask[i]) {
            continue;
        }
        PyObject *frames = tb_tuple(self, i);
        if (frames == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        unsigned int domain = snap->tbs[i]->domain;
        unsigned long long size = snap->traces[k].size;
        unsigned int total_nframe = snap->tbs[i]->total_nframe;
        PyObject *trace = ages ? Py_BuildValue("(IKNII)", domain, size, frames, total_nframe,
                                               (unsigned int)snap->traces[k].age)
                               : Py_BuildValue("(IKNI)", domain, size, frames, total_nframe);
        if (trace == NULL || PyList_Append(list, trace) < 0) {
            Py_XDECREF(trace);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(trace);
    }
    return list;
}

/* The function a frame ran: co_qualname on 3.11+, co_name before; frames
 * captured without the GIL kept no code object. */
static PyObject *
frame_function(const hw_frame_t *frame)
{
    if (frame->key == 0 || (frame->key & HW_FRAME_RAW)) {
        return PyUnicode_FromString("<unknown>");
    }
    PyCodeObject *code = (PyCodeObject *)frame->key;
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *name = code->co_qualname;
#else
    PyObject *name = code->co_name;
#endif
    if (name == NULL || !PyUnicode_Check(name)) {
        return PyUnicode_FromString("<unknown>");
    }
    return Py_NewRef(name);
}

static PyObject *
named_frames(SnapshotObject *self, uint32_t i)
{
    hw_snapshot_t *snap = self->snap;
    hw_traceback_t *tb = snap->tbs[i];
    if (hw_snapshot_resolve(snap, i, tb->nframe) < 0) {
        return NULL;
    }
    const hw_rframe_t *rf = hw_snapshot_rframes(snap, i);
    PyObject *tuple = PyTuple_New(tb->nframe);
    for (int j = 0; tuple != NULL && j < tb->nframe; j++) {
        PyObject *name = frame_function(&tb->frames[j]);
        PyObject *frame = name != NULL ? Py_BuildValue("(OiN)", rf[j].filename, rf[j].lineno, name)
                                       : NULL;
        if (frame == NULL) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, j, frame);
    }
    return tuple;
}

/* One row of tracebacks(): the live columns, then the peak, then the
 * allocation totals, as many as asked for. */
static PyObject *
tb_row(hw_snapshot_t *snap, uint32_t i, PyObject *frames, int peaks, int allocs)
{
    unsigned int domain = snap->tbs[i]->domain;
    unsigned int total_nframe = snap->tbs[i]->total_nframe;
    unsigned long long size = snap->tb_size[i];
    unsigned long long count = hw_count_round(snap->tb_est_blocks[i]);
    unsigned long long peak = snap->tb_peak[i];
    if (allocs) {
        return Py_BuildValue("(INIKKKKK)", domain, frames, total_nframe, size, count, peak,
                             (unsigned long long)snap->tb_alloc_size[i],
                             (unsigned long long)hw_count_round(snap->tb_alloc_blocks[i]));
    }
    if (peaks) {
        return Py_BuildValue("(INIKKK)", domain, frames, total_nframe, size, count, peak);
    }
    return Py_BuildValue("(INIKK)", domain, frames, total_nframe, size, count);
}

/* How many rows tracebacks() and routes() give: the live tracebacks, then
 * those holding only a peak, then those holding only allocation totals. */
static uint32_t
tb_rows(const hw_snapshot_t *snap, int peaks, int allocs)
{
    return allocs ? snap->ntbs_alloc : peaks ? snap->ntbs_all : snap->ntbs;
}

static PyObject *
Snapshot_tracebacks(SnapshotObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"names", "peaks", "allocs", NULL};
    int names = 0;
    int peaks = 0;
    int allocs = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|ppp:tracebacks", kwlist, &names, &peaks,
                                     &allocs)) {
        return NULL;
    }
    hw_snapshot_t *snap = self->snap;
    uint32_t n = tb_rows(snap, peaks, allocs);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        PyObject *frames = names ? named_frames(self, i) : tb_tuple(self, i);
        if (frames == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyObject *item = tb_row(snap, i, frames, peaks, allocs);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *
Snapshot_routes(SnapshotObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"peaks", "allocs", NULL};
    int peaks = 0;
    int allocs = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pp:routes", kwlist, &peaks, &allocs)) {
        return NULL;
    }
    hw_snapshot_t *snap = self->snap;
    uint32_t n = tb_rows(snap, peaks, allocs);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        /* Pinned, and a traceback's route never changes. */
        PyObject *route = PyLong_FromLong(snap->tbs[i]->route);
        if (route == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, route);
    }
    return list;
}

static int
parse_key_type(PyObject *obj, hw_key_type_t *key_type)
{
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_CompareWithASCIIString(obj, "lineno") == 0) {
            *key_type = HW_KEY_LINENO;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "filename") == 0) {
            *key_type = HW_KEY_FILENAME;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "traceback") == 0) {
            *key_type = HW_KEY_TRACEBACK;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown key_type: %R", obj);
    return -1;
}

static PyObject *
Snapshot_group(SnapshotObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key_type", "cumulative", "mask", "ages", NULL};
    PyObject *key_obj;
    int cumulative = 0;
    int ages = 0;
    PyObject *mask_obj = Py_None;
    hw_key_type_t key_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|pOp:group", kwlist, &key_obj, &cumulative,
                                     &mask_obj, &ages) ||
        parse_key_type(key_obj, &key_type) < 0) {
        return NULL;
    }
    if (cumulative && key_type == HW_KEY_TRACEBACK) {
        PyErr_Format(PyExc_ValueError, "cumulative mode cannot by used with key type %R", key_obj);
        return NULL;
    }
    if (ages && self->snap->traces == NULL) {
        PyErr_SetString(PyExc_ValueError, "ages need a snapshot taken with traces (traces=True)");
        return NULL;
    }
    if (ages && cumulative) {
        PyErr_SetString(PyExc_ValueError, "ages cannot be histogrammed in cumulative mode");
        return NULL;
    }
    const unsigned char *mask;
    size_t mask_len;
    if (parse_mask(self, mask_obj, &mask, &mask_len) < 0) {
        return NULL;
    }
    hw_groups_t *groups = hw_groups_build(self->snap, key_type, cumulative, mask, mask_len, ages);
    if (groups == NULL) {
        return NULL;
    }
    GroupsObject *obj = PyObject_New(GroupsObject, &Groups_Type);
    if (obj == NULL) {
        hw_groups_free(groups);
        return NULL;
    }
    obj->groups = groups;
    return (PyObject *)obj;
}

#define SNAP_GETTER(NAME, EXPR)                                      \
    static PyObject *Snapshot_get_##NAME(SnapshotObject *self, void *c) \
    {                                                                \
        (void)c;                                                     \
        hw_snapshot_t *snap = self->snap;                            \
        (void)snap;                                                  \
        return EXPR;                                                 \
    }

SNAP_GETTER(traceback_limit, PyLong_FromLong(snap->traceback_limit))
SNAP_GETTER(mode, PyUnicode_FromString(mode_names[snap->mode]))
SNAP_GETTER(sample_interval, PyLong_FromUnsignedLongLong(snap->sample_interval))
SNAP_GETTER(traced, PyLong_FromUnsignedLongLong(snap->traced))
SNAP_GETTER(peak, PyLong_FromUnsignedLongLong(snap->peak))
SNAP_GETTER(blocks, PyLong_FromUnsignedLongLong(hw_count_round(snap->est_blocks)))
SNAP_GETTER(has_traces, PyBool_FromLong(snap->traces != NULL))
SNAP_GETTER(ntraces, PyLong_FromSize_t(snap->ntraces))
SNAP_GETTER(ntracebacks, PyLong_FromUnsignedLong(snap->ntbs))
SNAP_GETTER(epoch, PyLong_FromUnsignedLong(snap->epoch))
SNAP_GETTER(allocs_folded,
            Py_BuildValue("(KKK)", (unsigned long long)snap->alloc_folded.alloc_size,
                          (unsigned long long)hw_count_round(snap->alloc_folded.alloc_blocks),
                          (unsigned long long)snap->alloc_folded.tracebacks))

static PyMethodDef Snapshot_methods[] = {
    {"traces", (PyCFunction)(void (*)(void))Snapshot_traces, METH_VARARGS | METH_KEYWORDS,
     "traces(mask=None, ages=False) -> list of (domain, size, frames, total_nframe), with "
     "ages=True (domain, size, frames, total_nframe, age): age in epochs, at most MAX_AGE."},
    {"routes", (PyCFunction)(void (*)(void))Snapshot_routes, METH_VARARGS | METH_KEYWORDS,
     "routes(peaks=False, allocs=False) -> the route id of each row of tracebacks(names, "
     "peaks, allocs), in the same order"},
    {"tracebacks", (PyCFunction)(void (*)(void))Snapshot_tracebacks, METH_VARARGS | METH_KEYWORDS,
     "tracebacks(names=False, peaks=False) -> list of (domain, frames, total_nframe, size, count), "
     "one per traceback; with names=True a frame is (filename, lineno, function); with "
     "peaks=True each row ends with the traceback's bytes at the peak, and the tracebacks "
     "holding only a peak follow; with allocs=True each row ends with the peak, then the "
     "bytes and blocks allocated there since tracing started, and the tracebacks holding "
     "only those totals follow."},
    {"group", (PyCFunction)(void (*)(void))Snapshot_group, METH_VARARGS | METH_KEYWORDS,
     "group(key_type, cumulative=False, mask=None, ages=False) -> Groups; ages=True "
     "histograms the traces by age (Groups.ages())."},
    {NULL, NULL, 0, NULL},
};

#define GETSET(NAME, DOC) {#NAME, (getter)Snapshot_get_##NAME, NULL, DOC, NULL}
static PyGetSetDef Snapshot_getset[] = {
    GETSET(traceback_limit, "frames kept per traceback"),
    GETSET(mode, "'exact' or 'sample'"),
    GETSET(sample_interval, "mean bytes between samples (sample mode)"),
    GETSET(traced, "traced bytes when taken (an estimate in sample mode)"),
    GETSET(peak, "peak traced bytes when taken"),
    GETSET(blocks, "traced blocks when taken (an estimate in sample mode)"),
    GETSET(has_traces, "whether traces() is available"),
    GETSET(ntraces, "number of traces held"),
    GETSET(ntracebacks, "number of distinct tracebacks held"),
    GETSET(epoch, "the age epoch when taken (set_epoch())"),
    GETSET(allocs_folded, "(bytes, blocks, tracebacks): allocation totals of the tracebacks "
                          "freed past ALLOC_KEEP idle ones"),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Snapshot_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "heapwatch._core.Snapshot",
    .tp_basicsize = sizeof(SnapshotObject),
    .tp_dealloc = (destructor)Snapshot_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What the tracer held at one moment (take_snapshot()).",
    .tp_methods = Snapshot_methods,
    .tp_getset = Snapshot_getset,
};

/* ---- module functions -------------------------------------------------- */

static PyObject *
core_start(PyObject *module, PyObject *args, PyObject *kwds)
{
    (void)module;
    static char *kwlist[] = {"nframe", "mode", "sample_interval", "profile", NULL};
    int nframe = 1;
    const char *mode_name = "exact";
    unsigned long long interval = HW_DEFAULT_SAMPLE_INTERVAL;
    PyObject *profile_arg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|isK$U:start", kwlist, &nframe, &mode_name,
                                     &interval, &profile_arg)) {
        return NULL;
    }
    int profile = profile_arg == NULL ? HW_PROFILE_TRACEMALLOC : profile_number(profile_arg);
    if (profile < 0) {
        return NULL;
    }
    if (nframe < 1 || nframe > HW_MAX_NFRAME) {
        PyErr_Format(PyExc_ValueError, "the number of frames must be in range [1; %i]",
                     HW_MAX_NFRAME);
        return NULL;
    }
    int mode;
    if (strcmp(mode_name, "exact") == 0) {
        mode = HW_MODE_EXACT;
    }
    else if (strcmp(mode_name, "sample") == 0) {
        mode = HW_MODE_SAMPLE;
    }
    else {
        PyErr_Format(PyExc_ValueError, "mode must be 'exact' or 'sample', got %R",
                     PyTuple_Size(args) > 1 ? PyTuple_GET_ITEM(args, 1)
                                            : PyDict_GetItemString(kwds, "mode"));
        return NULL;
    }
    if (interval < 1 || interval > HW_MAX_SAMPLE_INTERVAL) {
        PyErr_Format(PyExc_ValueError, "sample_interval must be in range [1; %llu] bytes, got %llu",
                     HW_MAX_SAMPLE_INTERVAL, interval);
        return NULL;
    }
    if (hw_start(nframe, mode, (uint64_t)interval, profile) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
core_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    hw_stop();
    Py_RETURN_NONE;
}

static PyObject *
core_is_tracing(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(hw_load_int(&hw_tracer.tracing));
}

static PyObject *
core_clear_traces(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    hw_clear_traces();
    Py_RETURN_NONE;
}

static PyObject *
core_reset_peak(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    hw_reset_peak();
    Py_RETURN_NONE;
}

static PyObject *
core_set_epoch(PyObject *module, PyObject *arg)
{
    (void)module;
    unsigned long epoch = PyLong_AsUnsignedLong(arg);
    if (epoch == (unsigned long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    uint32_t now = hw_get_epoch();
    if (epoch > UINT32_MAX || epoch < now) {
        PyErr_Format(PyExc_ValueError, "epoch must be in [%u, %u] (it never moves back), got %lu",
                     now, UINT32_MAX, epoch);
        return NULL;
    }
    hw_set_epoch((uint32_t)epoch);
    Py_RETURN_NONE;
}

static PyObject *
core_get_epoch(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLong(hw_get_epoch());
}

static PyObject *
core_set_thread_traced(PyObject *module, PyObject *arg)
{
    (void)module;
    int traced = PyObject_IsTrue(arg);
    if (traced < 0) {
        return NULL;
    }
    return PyBool_FromLong(hw_hooks_set_thread_traced(traced));
}

static PyObject *
core_wake_after(PyObject *module, PyObject *args)
{
    (void)module;
    double delay;
    PyObject *callback;
    if (!PyArg_ParseTuple(args, "dO:wake_after", &delay, &callback)) {
        return NULL;
    }
    if (hw_wake_arm(delay, callback) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
core_call_soon(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *callback;
    PyObject *frame = Py_None;
    if (!PyArg_ParseTuple(args, "O|O:call_soon", &callback, &frame)) {
        return NULL;
    }
    if (hw_call_soon(callback, frame == Py_None ? NULL : frame) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
core_wake_cancel(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(hw_wake_disarm());
}

static PyObject *
core_get_traceback_limit(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromLong(hw_load_int(&hw_tracer.max_nframe));
}

static PyObject *
core_get_traced_memory(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!hw_load_int(&hw_tracer.tracing)) {
        return Py_BuildValue("(ii)", 0, 0);
    }
    uint64_t current, peak, est_blocks;
    hw_get_traced(&current, &peak, &est_blocks);
    return Py_BuildValue("(KK)", (unsigned long long)current, (unsigned long long)peak);
}

static PyObject *
core_get_tracemalloc_memory(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromSize_t(hw_tracer_memory());
}

static PyObject *
core_get_object_traceback(PyObject *module, PyObject *obj)
{
    (void)module;
    if (!hw_load_int(&hw_tracer.tracing)) {
        Py_RETURN_NONE;
    }
    uintptr_t ptr = (uintptr_t)hw_object_block(obj);
    hw_traceback_t *tb = NULL;
    hw_lock();
    hw_flush_unlocked();
    hw_trace_t trace;
    if (hw_tracer.tracing && hw_traces_get_unlocked(&hw_tracer.traces, ptr, &trace)) {
        tb = hw_tb_by_id_unlocked(trace.tb);
        if (tb != NULL) {
            tb->pins++; /* keeps it and its code objects alive while we resolve */
        }
    }
    hw_unlock();
    if (tb == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *frames = PyTuple_New(tb->nframe);
    for (int i = 0; frames != NULL && i < tb->nframe; i++) {
        int lineno;
        PyObject *name = hw_frame_resolve(tb, i, NULL, &lineno);
        PyObject *frame = name != NULL ? Py_BuildValue("(Ni)", name, lineno) : NULL;
        if (frame == NULL) {
            Py_CLEAR(frames);
            break;
        }
        PyTuple_SET_ITEM(frames, i, frame);
    }
    hw_lock();
    tb->pins--;
    hw_tb_release_if_unused_unlocked(tb);
    hw_unlock();
    return frames;
}

static PyObject *
core_take_snapshot(PyObject *module, PyObject *args, PyObject *kwds)
{
    (void)module;
    static char *kwlist[] = {"traces", "reset_peak", NULL};
    int with_traces = 1;
    int reset_peak = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pp:take_snapshot", kwlist, &with_traces,
                                     &reset_peak)) {
        return NULL;
    }
    SnapshotObject *obj = PyObject_New(SnapshotObject, &Snapshot_Type);
    if (obj == NULL) {
        return NULL;
    }
    obj->tb_tuples = NULL;
    obj->snap = hw_snapshot_take(with_traces, reset_peak);
    if (obj->snap == NULL) {
        Py_DECREF(obj);
        return NULL;
    }
    return (PyObject *)obj;
}

static PyObject *
core_get_config(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return Py_BuildValue("{s:O,s:s,s:K,s:i,s:s}", "tracing",
                         hw_load_int(&hw_tracer.tracing) ? Py_True : Py_False, "mode",
                         mode_names[hw_load_int(&hw_tracer.mode)], "sample_interval",
                         (unsigned long long)__atomic_load_n(&hw_tracer.sample_interval,
                                                             __ATOMIC_RELAXED),
                         "nframe", hw_load_int(&hw_tracer.max_nframe), "profile",
                         profile_names[hw_load_int(&hw_tracer.profile)]);
}

static PyObject *
core_get_stats(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    uint64_t current, peak, est_blocks;
    hw_get_traced(&current, &peak, &est_blocks);
    hw_lock();
    size_t ntbs = hw_tb_count_unlocked();
    size_t graveyard = hw_graveyard_len_unlocked();
    hw_unlock();
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:n,s:n,s:n,s:n,s:n,s:K}", "traced", (unsigned long long)current,
        "peak",
        (unsigned long long)peak, "blocks", (unsigned long long)hw_count_round(est_blocks),
        "dropped", (unsigned long long)__atomic_load_n(&hw_tracer.dropped, __ATOMIC_RELAXED),
        "recorded", (unsigned long long)__atomic_load_n(&hw_tracer.recorded, __ATOMIC_RELAXED),
        "live_traces", (Py_ssize_t)__atomic_load_n(&hw_tracer.ntraces, __ATOMIC_RELAXED),
        "tracebacks", (Py_ssize_t)ntbs, "graveyard", (Py_ssize_t)graveyard, "snapshot_memory",
        (Py_ssize_t)hw_mem_used(HW_MEM_SNAPSHOT), "span_routes",
        (Py_ssize_t)hw_routes_span_count(), "span_routes_dropped",
        (unsigned long long)hw_routes_span_dropped());
}

static PyObject *
core_drain(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    hw_housekeeping();
    Py_RETURN_NONE;
}

static PyObject *
core_hooks_installed(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(hw_hooks_installed());
}

static PyObject *
core_reftracer_on_top(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(hw_reftracer_on_top());
}

static PyObject *
core_track(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned int domain;
    unsigned long long ptr, size;
    if (!PyArg_ParseTuple(args, "IKK:_track", &domain, &ptr, &size)) {
        return NULL;
    }
    if (!hw_load_int(&hw_tracer.tracing)) {
        return PyLong_FromLong(-2);
    }
    if (ptr == 0) {
        PyErr_SetString(PyExc_ValueError, "ptr must not be 0");
        return NULL;
    }
    hw_capture_t cap;
    if (hw_capture(&cap, hw_tstate_unchecked(), 0, hw_load_int(&hw_tracer.max_nframe),
                   hw_counts_depth()) < 0) {
        return PyErr_NoMemory();
    }
    cap.route = hw_route_current();
    uint64_t dropped = __atomic_load_n(&hw_tracer.dropped, __ATOMIC_RELAXED);
    hw_lock();
    if (hw_tracer.tracing) {
        hw_add_trace_unlocked(domain, (uintptr_t)ptr, (size_t)size, &cap);
    }
    hw_unlock();
    hw_capture_release(&cap);
    int failed = __atomic_load_n(&hw_tracer.dropped, __ATOMIC_RELAXED) != dropped;
    return PyLong_FromLong(failed ? -1 : 0);
}

static PyObject *
core_untrack(PyObject *module, PyObject *args)
{
    (void)module;
    unsigned int domain;
    unsigned long long ptr;
    if (!PyArg_ParseTuple(args, "IK:_untrack", &domain, &ptr)) {
        return NULL;
    }
    if (!hw_load_int(&hw_tracer.tracing)) {
        return PyLong_FromLong(-2);
    }
    hw_lock();
    if (hw_tracer.tracing) {
        (void)hw_remove_trace_unlocked(domain, (uintptr_t)ptr);
    }
    hw_unlock();
    hw_graveyard_drain();
    return PyLong_FromLong(0);
}

static PyObject *
core_native_heap(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (!hw_native_heap_available()) {
        Py_RETURN_NONE;
    }
    uint64_t in_use = 0, retained = 0;
    Py_BEGIN_ALLOW_THREADS
    (void)hw_native_heap(&in_use, &retained);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(KK)", (unsigned long long)in_use, (unsigned long long)retained);
}

/* read_small_file's default and largest sizes: /proc's one-line files,
 * and /proc/stat on a machine with many CPUs. */
#define SMALL_FILE_DEFAULT 4096
#define SMALL_FILE_MAX 1048576

static PyObject *
core_read_small_file(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *given = NULL, *path = NULL;
    Py_ssize_t limit = SMALL_FILE_DEFAULT;
    if (!PyArg_ParseTuple(args, "O|n:read_small_file", &given, &limit) ||
        !PyUnicode_FSConverter(given, &path)) {
        return NULL;
    }
    if (limit < 0 || limit > SMALL_FILE_MAX) {
        PyErr_Format(PyExc_ValueError, "read_small_file: limit must be from 0 to %d, got %zd",
                     SMALL_FILE_MAX, limit);
        Py_DECREF(path);
        return NULL;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, limit);
    if (data == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    /* With the GIL (released only to wait): see descriptors.h. */
    ssize_t n = hw_read_small_file(PyBytes_AS_STRING(path), PyBytes_AS_STRING(data),
                                   (size_t)limit);
    if (n < 0) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, given);
        Py_DECREF(path);
        Py_DECREF(data);
        return NULL;
    }
    Py_DECREF(path);
    if (_PyBytes_Resize(&data, n) < 0) {
        return NULL;
    }
    return data;
}

static PyObject *
core_count_dir_entries(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *given = NULL, *path = NULL;
    if (!PyArg_ParseTuple(args, "O:count_dir_entries", &given) ||
        !PyUnicode_FSConverter(given, &path)) {
        return NULL;
    }
    /* With the GIL (released only to wait): see descriptors.h. */
    long count = hw_count_dir_entries(PyBytes_AS_STRING(path));
    if (count < 0) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, given);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    return PyLong_FromLong(count);
}

static PyObject *
core_accept(PyObject *module, PyObject *arg)
{
    (void)module;
    int fd = PyObject_AsFileDescriptor(arg);
    if (fd < 0) {
        return NULL;
    }
    /* With the GIL (released only to wait): see descriptors.h. */
    int conn = hw_accept_above_floor(fd);
    if (conn == -2) {
        PyErr_Format(PyExc_ValueError,
                     "accept(%d): the listening socket must be non-blocking (with the GIL "
                     "held, accept may not wait)",
                     fd);
        return NULL;
    }
    if (conn < 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(conn);
}

static PyObject *
core_list_dir(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *given = NULL, *path = NULL;
    if (!PyArg_ParseTuple(args, "O:list_dir", &given) || !PyUnicode_FSConverter(given, &path)) {
        return NULL;
    }
    /* With the GIL (released only to wait), kept until closedir(): the
     * directory's descriptor is ours all along (descriptors.h). */
    DIR *dir = hw_opendir(PyBytes_AS_STRING(path));
    Py_DECREF(path);
    if (dir == NULL) {
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, given);
    }
    PyObject *names = PyList_New(0);
    const struct dirent *entry;
    errno = 0;
    while (names != NULL && (entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) {
            continue;
        }
        PyObject *name = PyUnicode_DecodeFSDefault(entry->d_name);
        if (name == NULL || PyList_Append(names, name) < 0) {
            Py_CLEAR(names);
        }
        Py_XDECREF(name);
        errno = 0;
    }
    int saved = names != NULL ? errno : 0;
    (void)closedir(dir);
    if (saved != 0) {
        Py_DECREF(names);
        errno = saved;
        return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, given);
    }
    return names;
}

static PyObject *
core_open_file(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *given = NULL, *path = NULL;
    int flags = 0, mode = 0600;
    if (!PyArg_ParseTuple(args, "Oi|i:open_file", &given, &flags, &mode) ||
        !PyUnicode_FSConverter(given, &path)) {
        return NULL;
    }
    /* With the GIL (released only to wait): see descriptors.h. */
    int fd = hw_open_above_floor(PyBytes_AS_STRING(path), flags, mode);
    if (fd < 0) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, given);
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    return PyLong_FromLong(fd);
}

static PyObject *
core_interposed(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromSize_t(hw_interpose_count());
}

static PyObject *
core_at_exit(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    hw_at_exit();
    (void)hw_wake_disarm(); /* nothing of ours starts as the process exits */
    Py_RETURN_NONE;
}

/* Walks every table and checks the invariants of tracer.h. */
static const char *
check_table_unlocked(const hw_traces_t *table, uint32_t domain, uint64_t *counts, uint64_t *sizes,
                     uint64_t *est_blocks_by_tb, uint32_t bound)
{
    for (size_t i = 0; i <= table->mask; i++) {
        const hw_slot_t *slot = &table->slots[i];
        if (slot->ptr == 0) {
            continue;
        }
        if (slot->tb == 0 || slot->tb >= bound) {
            return "a trace names an invalid traceback id";
        }
        hw_traceback_t *tb = hw_tb_by_id_unlocked(slot->tb);
        if (tb == NULL) {
            return "a trace names a freed traceback";
        }
        if (tb->domain != domain) {
            return "a trace's traceback belongs to another domain";
        }
        uint64_t est, cnt;
        hw_weigh(hw_traces_slot_size_unlocked(table, slot), &est, &cnt);
        counts[slot->tb]++;
        sizes[slot->tb] += est;
        est_blocks_by_tb[slot->tb] += cnt;
    }
    return NULL;
}

static PyObject *
core_check_invariants(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    const char *problem = NULL;
    hw_lock();
    uint32_t bound = hw_tb_id_bound_unlocked();
    uint64_t *counts = hw_calloc(HW_MEM_SNAPSHOT, bound, sizeof(uint64_t));
    uint64_t *sizes = hw_calloc(HW_MEM_SNAPSHOT, bound, sizeof(uint64_t));
    uint64_t *est_blocks_by_tb = hw_calloc(HW_MEM_SNAPSHOT, bound, sizeof(uint64_t));
    if (counts == NULL || sizes == NULL || est_blocks_by_tb == NULL) {
        problem = "out of memory";
        goto done;
    }
    if (!hw_tracer.tracing) {
        goto done;
    }
    hw_flush_unlocked();
    uint64_t entries = hw_tracer.traces.count;
    problem = check_table_unlocked(&hw_tracer.traces, 0, counts, sizes, est_blocks_by_tb, bound);
    for (size_t d = 0; problem == NULL && d < hw_tracer.ndomains; d++) {
        entries += hw_tracer.domains[d].traces.count;
        problem = check_table_unlocked(&hw_tracer.domains[d].traces, hw_tracer.domains[d].domain,
                                       counts, sizes, est_blocks_by_tb, bound);
    }
    if (problem != NULL) {
        goto done;
    }
    if (entries != __atomic_load_n(&hw_tracer.ntraces, __ATOMIC_RELAXED)) {
        problem = "ntraces differs from the number of trace slots";
        goto done;
    }
    uint64_t total = 0, total_fp = 0, total_peak = 0;
    for (uint32_t id = 1; id < bound; id++) {
        hw_traceback_t *tb = hw_tb_by_id_unlocked(id);
        if (tb == NULL) {
            continue;
        }
        if (tb->ntraces != counts[id] || tb->size != sizes[id] || tb->est_blocks != est_blocks_by_tb[id]) {
            problem = "a traceback's sums differ from its traces";
            goto done;
        }
        if (tb->pending != 0) {
            problem = "a traceback counts queued inserts after the queue was applied";
            goto done;
        }
        if ((tb->ntraces == 0 && tb->pins == 0) != (tb->idle != 0)) {
            problem = "a traceback's idle mark disagrees with its counts";
            goto done;
        }
        total += tb->size;
        total_fp += tb->est_blocks;
        total_peak += hw_tb_peak_unlocked(tb);
    }
    if (total != hw_tracer.traced || total_fp != hw_tracer.est_blocks) {
        problem = "the traced totals differ from the sum of the traces";
    }
    else if (hw_tracer.peak < hw_tracer.traced) {
        problem = "the peak is below the current traced size";
    }
    else if (hw_tracer.peak_rising ? hw_tracer.traced != hw_tracer.peak
                                   : total_peak != hw_tracer.peak) {
        problem = "the per-site peaks do not sum to the peak";
    }
done:
    hw_unlock();
    hw_free(HW_MEM_SNAPSHOT, counts);
    hw_free(HW_MEM_SNAPSHOT, sizes);
    hw_free(HW_MEM_SNAPSHOT, est_blocks_by_tb);
    if (problem != NULL) {
        PyErr_SetString(PyExc_AssertionError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"start", (PyCFunction)(void (*)(void))core_start, METH_VARARGS | METH_KEYWORDS,
     "start(nframe=1, mode='exact', sample_interval=524288, *, profile='tracemalloc'): profile "
     "'agent' records neither the whole depth (total_nframe: the frames kept, plus one if the "
     "stack goes deeper) nor the re-stamps of blocks a free list hands back."},
    {"stop", core_stop, METH_NOARGS, "Stop tracing and clear every trace."},
    {"is_tracing", core_is_tracing, METH_NOARGS, NULL},
    {"clear_traces", core_clear_traces, METH_NOARGS, NULL},
    {"reset_peak", core_reset_peak, METH_NOARGS, NULL},
    {"set_epoch", core_set_epoch, METH_O,
     "set_epoch(epoch): traces recorded from now on are of this epoch (the agent's cycle); "
     "an age is a number of epochs"},
    {"get_epoch", core_get_epoch, METH_NOARGS, NULL},
    {"set_thread_traced", core_set_thread_traced, METH_O,
     "set_thread_traced(traced) -> bool: whether the blocks this thread allocates from now on "
     "are recorded (False for heapwatch's own threads; frees are always seen); returns the "
     "previous setting."},
    {"get_traceback_limit", core_get_traceback_limit, METH_NOARGS, NULL},
    {"get_traced_memory", core_get_traced_memory, METH_NOARGS, "-> (current, peak)"},
    {"get_tracemalloc_memory", core_get_tracemalloc_memory, METH_NOARGS,
     "Bytes held by the tracer: tables at capacity, tracebacks, names."},
    {"get_object_traceback", core_get_object_traceback, METH_O, "-> frames or None"},
    {"take_snapshot", (PyCFunction)(void (*)(void))core_take_snapshot,
     METH_VARARGS | METH_KEYWORDS, "take_snapshot(traces=True, reset_peak=False) -> Snapshot"},
    {"get_config", core_get_config, METH_NOARGS, NULL},
    {"get_stats", core_get_stats, METH_NOARGS, NULL},
    {"drain", core_drain, METH_NOARGS, "Release code objects no trace refers to any more."},
    {"hooks_installed", core_hooks_installed, METH_NOARGS, NULL},
    {"_reftracer_on_top", core_reftracer_on_top, METH_NOARGS,
     "whether heapwatch's reference tracer (3.13+) holds the interpreter's slot"},
    {"set_route_var", hw_py_set_route_var, METH_O,
     "set_route_var(var): the contextvars.ContextVar whose int value (0 to MAX_ROUTE) labels "
     "each allocation recorded with the GIL held; None: none"},
    {"set_span_routes", hw_py_set_span_routes, METH_VARARGS,
     "set_span_routes(var, key): OpenTelemetry's context variable and the key of the current "
     "span in its Context; when set_route_var's gives 0, the span's route (span_route) "
     "labels the allocation; (None, None): none"},
    {"span_route", hw_py_span_route, METH_VARARGS,
     "span_route(span, route): the route of a span object, kept by address without a "
     "reference; route 0 forgets it"},
    {"_track", core_track, METH_VARARGS, "_track(domain, ptr, size) -> 0, -1 or -2"},
    {"_untrack", core_untrack, METH_VARARGS, "_untrack(domain, ptr) -> 0 or -2"},
    {"native_heap", core_native_heap, METH_NOARGS,
     "-> (in_use, retained) bytes of the C library's heap (glibc's mallinfo2), or None"},
    {"read_small_file", core_read_small_file, METH_VARARGS,
     "read_small_file(path, limit=" Py_STRINGIFY(SMALL_FILE_DEFAULT) ") -> bytes: the first "
     "limit bytes (at most SMALL_FILE_MAX) of a regular file (a /proc file), opened, read and "
     "closed with the GIL held, so the service never sees the descriptor"},
    {"count_dir_entries", core_count_dir_entries, METH_VARARGS,
     "count_dir_entries(path) -> int: the entries of a directory but . and .. (/proc/self/fd), "
     "read with the GIL held"},
    {"list_dir", core_list_dir, METH_VARARGS,
     "list_dir(path) -> list[str]: the names in a directory but . and .., in no order, its "
     "descriptor made and closed with the GIL held (descriptors.h)"},
    {"open_file", core_open_file, METH_VARARGS,
     "open_file(path, flags, mode=0o600) -> int: os.open() with the GIL held, while 0, 1 and 2 "
     "are open, the descriptor close-on-exec and numbered above 2 (descriptors.h)"},
    {"accept", core_accept, METH_O,
     "accept(fd) -> int: a connection on the non-blocking listening socket fd, close-on-exec "
     "and numbered " Py_STRINGIFY(HW_FD_FLOOR) " or above, accepted with the GIL held "
     "(BlockingIOError: none waiting)"},
    {"_interposed", core_interposed, METH_NOARGS,
     "-> GOT entries now pointing at heapwatch's PyTraceMalloc_Track/Untrack and dlopen wrappers"},
    {"wake_after", core_wake_after, METH_VARARGS,
     "wake_after(delay, callback): callback() from the main thread once, at a safe point "
     "after the first allocation made delay seconds or more from now (replaces the last)"},
    {"call_soon", core_call_soon, METH_VARARGS,
     "call_soon(callback, frame=None): callback() once, from the main thread at its next "
     "safe point (of frame, when given)"},
    {"wake_cancel", core_wake_cancel, METH_NOARGS,
     "wake_cancel() -> bool: forgets the armed wake-up; whether there was one"},
    {"_at_exit", core_at_exit, METH_NOARGS, NULL},
    {"_check_invariants", core_check_invariants, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "heapwatch._core",
    .m_doc = "heapwatch's allocator hooks, trace tables and aggregation.",
    .m_size = -1,
    .m_methods = core_methods,
};

static int
register_at_exit(PyObject *module)
{
    PyObject *atexit = PyImport_ImportModule("atexit");
    if (atexit == NULL) {
        return -1;
    }
    PyObject *func = PyObject_GetAttrString(module, "_at_exit");
    PyObject *res = func != NULL ? PyObject_CallMethod(atexit, "register", "O", func) : NULL;
    Py_XDECREF(func);
    Py_DECREF(atexit);
    Py_XDECREF(res);
    return res != NULL ? 0 : -1;
}

PyMODINIT_FUNC
PyInit__core(void)
{
    if (PyType_Ready(&Snapshot_Type) < 0 || PyType_Ready(&Groups_Type) < 0) {
        return NULL;
    }
    if (hw_hooks_init_once() < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&core_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObject(module, "Snapshot", Py_NewRef((PyObject *)&Snapshot_Type)) < 0 ||
        PyModule_AddObject(module, "Groups", Py_NewRef((PyObject *)&Groups_Type)) < 0 ||
        PyModule_AddIntConstant(module, "MAX_NFRAME", HW_MAX_NFRAME) < 0 ||
        PyModule_AddObject(module, "MAX_SAMPLE_INTERVAL",
                           PyLong_FromUnsignedLongLong(HW_MAX_SAMPLE_INTERVAL)) < 0 ||
        PyModule_AddIntConstant(module, "DEFAULT_SAMPLE_INTERVAL", HW_DEFAULT_SAMPLE_INTERVAL) < 0 ||
        PyModule_AddIntConstant(module, "MAX_AGE", HW_MAX_AGE) < 0 ||
        PyModule_AddIntConstant(module, "ALLOC_KEEP", HW_TB_ALLOC_KEEP) < 0 ||
        PyModule_AddIntConstant(module, "MAX_ROUTE", HW_MAX_ROUTE) < 0 ||
        PyModule_AddIntConstant(module, "SPAN_ROUTES", HW_SPAN_ROUTES) < 0 ||
        PyModule_AddIntConstant(module, "AGE_BUCKETS", HW_AGE_BUCKETS) < 0 ||
        PyModule_AddIntConstant(module, "SMALL_FILE_MAX", SMALL_FILE_MAX) < 0 ||
        register_at_exit(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
