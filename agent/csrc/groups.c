#include "groups.h"

#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "tracer.h"

static uint64_t
key_hash(const hw_rframe_t *key, uint32_t n)
{
    uint64_t h = UINT64_C(0x345678) ^ n;
    for (uint32_t i = 0; i < n; i++) {
        /* str hashes are cached and cannot fail */
        h = (h ^ (uint64_t)PyObject_Hash(key[i].filename)) * UINT64_C(0xFF51AFD7ED558CCD);
        h = (h ^ (uint32_t)key[i].lineno) * UINT64_C(0xC4CEB9FE1A85EC53);
        h ^= h >> 31;
    }
    return h;
}

static inline int
frame_eq(const hw_rframe_t *a, const hw_rframe_t *b)
{
    return a->lineno == b->lineno &&
           (a->filename == b->filename || PyUnicode_Compare(a->filename, b->filename) == 0);
}

static int
key_eq(const hw_rframe_t *a, uint32_t na, const hw_rframe_t *b, uint32_t nb)
{
    if (na != nb) {
        return 0;
    }
    for (uint32_t i = 0; i < na; i++) {
        if (!frame_eq(&a[i], &b[i])) {
            return 0;
        }
    }
    return 1;
}

/* Traceback order: tuples of (filename, lineno) from the oldest frame. */
static int
key_cmp(const hw_rframe_t *a, uint32_t na, const hw_rframe_t *b, uint32_t nb)
{
    uint32_t n = na < nb ? na : nb;
    for (uint32_t i = 0; i < n; i++) {
        const hw_rframe_t *fa = &a[na - 1 - i];
        const hw_rframe_t *fb = &b[nb - 1 - i];
        if (fa->filename != fb->filename) {
            int c = PyUnicode_Compare(fa->filename, fb->filename);
            if (c != 0) {
                return c;
            }
        }
        if (fa->lineno != fb->lineno) {
            return fa->lineno < fb->lineno ? -1 : 1;
        }
    }
    return na < nb ? -1 : (na > nb ? 1 : 0);
}

static inline const hw_rframe_t *
group_key(const hw_groups_t *g, const hw_group_t *grp)
{
    return &g->keys[grp->key_off];
}

/* Index of the group with this key, or -1. */
static Py_ssize_t
find_any(const hw_groups_t *g, uint64_t hash, const hw_rframe_t *key, uint32_t n)
{
    for (size_t i = hash & g->index_mask;; i = (i + 1) & g->index_mask) {
        uint32_t slot = g->index[i];
        if (slot == 0) {
            return -1;
        }
        const hw_group_t *grp = &g->groups[slot - 1];
        if (grp->hash == hash && key_eq(group_key(g, grp), grp->key_len, key, n)) {
            return (Py_ssize_t)(slot - 1);
        }
    }
}

/* Index of the group with live traces with this key, or -1. */
static Py_ssize_t
find(const hw_groups_t *g, uint64_t hash, const hw_rframe_t *key, uint32_t n)
{
    Py_ssize_t i = find_any(g, hash, key, n);
    return i >= 0 && (size_t)i < g->nlive ? i : -1;
}

static int
grow_index(hw_groups_t *g)
{
    size_t cap = (g->index_mask + 1) * 2;
    uint32_t *index = hw_calloc(HW_MEM_SNAPSHOT, cap, sizeof(uint32_t));
    if (index == NULL) {
        return -1;
    }
    for (size_t k = 0; k < g->ngroups; k++) {
        size_t i = g->groups[k].hash & (cap - 1);
        while (index[i] != 0) {
            i = (i + 1) & (cap - 1);
        }
        index[i] = (uint32_t)(k + 1);
    }
    hw_free(HW_MEM_SNAPSHOT, g->index);
    g->index = index;
    g->index_mask = cap - 1;
    return 0;
}

typedef struct {
    uint64_t size, est_blocks, peak;
} hw_sums_t;

/* Returns the index of key's group, or -1 when out of memory. */
static Py_ssize_t
accumulate(hw_groups_t *g, const hw_rframe_t *key, uint32_t n, const hw_sums_t *sums)
{
    uint64_t hash = key_hash(key, n);
    Py_ssize_t found = find_any(g, hash, key, n);
    if (found >= 0) {
        g->groups[found].size += sums->size;
        g->groups[found].est_blocks += sums->est_blocks;
        g->groups[found].peak += sums->peak;
        return found;
    }
    if ((g->ngroups + 1) * 2 > g->index_mask + 1 && grow_index(g) < 0) {
        return -1;
    }
    if (g->ngroups == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 256;
        hw_group_t *grown = hw_realloc(HW_MEM_SNAPSHOT, g->groups, cap * sizeof(hw_group_t));
        if (grown == NULL) {
            return -1;
        }
        g->groups = grown;
        g->cap = cap;
    }
    if (g->nkeys + n > g->keys_cap) {
        size_t cap = g->keys_cap ? g->keys_cap * 2 : 256;
        while (cap < g->nkeys + n) {
            cap *= 2;
        }
        hw_rframe_t *grown = hw_realloc(HW_MEM_SNAPSHOT, g->keys, cap * sizeof(hw_rframe_t));
        if (grown == NULL) {
            return -1;
        }
        g->keys = grown;
        g->keys_cap = cap;
    }
    hw_group_t *grp = &g->groups[g->ngroups];
    grp->hash = hash;
    grp->size = sums->size;
    grp->est_blocks = sums->est_blocks;
    grp->peak = sums->peak;
    grp->key_off = (uint32_t)g->nkeys;
    grp->key_len = n;
    memcpy(&g->keys[g->nkeys], key, n * sizeof(hw_rframe_t));
    g->nkeys += n;
    size_t i = hash & g->index_mask;
    while (g->index[i] != 0) {
        i = (i + 1) & g->index_mask;
    }
    g->index[i] = (uint32_t)(++g->ngroups);
    return (Py_ssize_t)(g->ngroups - 1);
}

void
hw_groups_free(hw_groups_t *g)
{
    if (g == NULL) {
        return;
    }
    hw_free(HW_MEM_SNAPSHOT, g->groups);
    hw_free(HW_MEM_SNAPSHOT, g->keys);
    hw_free(HW_MEM_SNAPSHOT, g->index);
    hw_free(HW_MEM_SNAPSHOT, g->order);
    hw_free(HW_MEM_SNAPSHOT, g->ages);
    Py_XDECREF(g->filenames);
    hw_free(HW_MEM_SNAPSHOT, g);
}

static inline int
age_bucket(uint32_t age)
{
    return age == 0 ? 0 : 32 - __builtin_clz(age);
}

/* Histograms the snapshot's traces by age into their groups (tb_group: the
 * group of each live traceback, UINT32_MAX if left out). */
static int
histogram_ages(hw_groups_t *g, const hw_snapshot_t *snap, const uint32_t *tb_group)
{
    g->ages = hw_calloc(HW_MEM_SNAPSHOT, g->ngroups * HW_AGE_BUCKETS + 1, sizeof(uint64_t));
    if (g->ages == NULL) {
        return -1;
    }
    for (size_t k = 0; k < snap->ntraces; k++) {
        const hw_snap_trace_t *trace = &snap->traces[k];
        uint32_t gi = tb_group[trace->tb];
        if (gi == UINT32_MAX) {
            continue;
        }
        uint64_t est, blocks;
        hw_weigh_as(snap->mode, snap->sample_interval, trace->size, &est, &blocks);
        g->ages[(size_t)gi * HW_AGE_BUCKETS + (size_t)age_bucket(trace->age)] += est;
    }
    return 0;
}

hw_groups_t *
hw_groups_build(hw_snapshot_t *snap, hw_key_type_t key_type, int cumulative,
                const unsigned char *mask, size_t mask_len, int ages)
{
    uint32_t *tb_group = NULL;
    hw_groups_t *g = hw_calloc(HW_MEM_SNAPSHOT, 1, sizeof(*g));
    if (g == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    g->index_mask = 255;
    g->index = hw_calloc(HW_MEM_SNAPSHOT, g->index_mask + 1, sizeof(uint32_t));
    if (g->index == NULL) {
        goto nomem;
    }
    g->filenames = Py_NewRef(snap->filenames);
    if (ages) {
        tb_group = hw_malloc(HW_MEM_SNAPSHOT, ((size_t)snap->ntbs + 1) * sizeof(uint32_t));
        if (tb_group == NULL) {
            goto nomem;
        }
        memset(tb_group, 0xff, ((size_t)snap->ntbs + 1) * sizeof(uint32_t));
    }
    int top_only = !cumulative && key_type != HW_KEY_TRACEBACK;
    for (uint32_t i = 0; i < snap->ntbs_all; i++) {
        if (i == snap->ntbs) {
            g->nlive = g->ngroups;
        }
        if (mask != NULL && i < mask_len && !mask[i]) {
            continue;
        }
        hw_sums_t sums = {snap->tb_size[i], snap->tb_est_blocks[i], snap->tb_peak[i]};
        hw_traceback_t *tb = snap->tbs[i];
        if (hw_snapshot_resolve(snap, i, top_only ? 1 : tb->nframe) < 0) {
            goto error;
        }
        const hw_rframe_t *frames = hw_snapshot_rframes(snap, i);
        g->total_size += sums.size;
        g->total_est_blocks += sums.est_blocks;
        g->total_peak += sums.peak;
        if (!cumulative) {
            hw_rframe_t key = frames[0];
            Py_ssize_t gi;
            if (key_type == HW_KEY_TRACEBACK) {
                gi = accumulate(g, frames, tb->nframe, &sums);
            }
            else {
                if (key_type == HW_KEY_FILENAME) {
                    key.lineno = 0;
                }
                gi = accumulate(g, &key, 1, &sums);
            }
            if (gi < 0) {
                goto nomem;
            }
            if (tb_group != NULL && i < snap->ntbs) {
                tb_group[i] = (uint32_t)gi;
            }
            continue;
        }
        /* As the stdlib: every frame counts, repeated frames too. */
        for (int j = 0; j < tb->nframe; j++) {
            hw_rframe_t key = frames[j];
            if (key_type == HW_KEY_FILENAME) {
                key.lineno = 0;
            }
            if (accumulate(g, &key, 1, &sums) < 0) {
                goto nomem;
            }
        }
    }
    if (snap->ntbs == snap->ntbs_all) {
        g->nlive = g->ngroups;
    }
    if (tb_group != NULL && histogram_ages(g, snap, tb_group) < 0) {
        goto nomem;
    }
    hw_free(HW_MEM_SNAPSHOT, tb_group);
    return g;

nomem:
    PyErr_NoMemory();
error:
    hw_free(HW_MEM_SNAPSHOT, tb_group);
    hw_groups_free(g);
    return NULL;
}

static int
stat_cmp_desc(const void *pa, const void *pb, void *arg)
{
    const hw_groups_t *g = arg;
    const hw_group_t *a = &g->groups[*(const uint32_t *)pa];
    const hw_group_t *b = &g->groups[*(const uint32_t *)pb];
    if (a->size != b->size) {
        return a->size < b->size ? 1 : -1;
    }
    uint64_t ca = hw_count_round(a->est_blocks), cb = hw_count_round(b->est_blocks);
    if (ca != cb) {
        return ca < cb ? 1 : -1;
    }
    return -key_cmp(group_key(g, a), a->key_len, group_key(g, b), b->key_len);
}

static int
peak_cmp_desc(const void *pa, const void *pb, void *arg)
{
    const hw_groups_t *g = arg;
    const hw_group_t *a = &g->groups[*(const uint32_t *)pa];
    const hw_group_t *b = &g->groups[*(const uint32_t *)pb];
    if (a->peak != b->peak) {
        return a->peak < b->peak ? 1 : -1;
    }
    return stat_cmp_desc(pa, pb, arg);
}

/* Indices of the first n groups in the order of cmp; NULL with an
 * exception set. */
static uint32_t *
new_order(hw_groups_t *g, size_t n, int (*cmp)(const void *, const void *, void *))
{
    uint32_t *order = hw_malloc(HW_MEM_SNAPSHOT, (n + 1) * sizeof(uint32_t));
    if (order == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        order[i] = (uint32_t)i;
    }
    qsort_r(order, n, sizeof(uint32_t), cmp, g);
    return order;
}

static int
ensure_order(hw_groups_t *g)
{
    if (g->order != NULL) {
        return 0;
    }
    g->order = new_order(g, g->nlive, stat_cmp_desc);
    return g->order == NULL ? -1 : 0;
}

static size_t
clamp(Py_ssize_t limit, size_t n)
{
    return (limit < 0 || (size_t)limit > n) ? n : (size_t)limit;
}

static PyObject *
age_tuple(const uint64_t *buckets)
{
    PyObject *tuple = PyTuple_New(HW_AGE_BUCKETS);
    for (int b = 0; tuple != NULL && b < HW_AGE_BUCKETS; b++) {
        PyObject *v = PyLong_FromUnsignedLongLong(buckets[b]);
        if (v == NULL) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, b, v);
    }
    return tuple;
}

enum { ROW_PLAIN, ROW_PEAK, ROW_AGES };

/* (frames, size, count), then peak or the age histogram as the fourth
 * field, for the first n groups of order. */
static PyObject *
groups_to_list(const hw_groups_t *g, const uint32_t *order, size_t n, int row)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const hw_group_t *grp = &g->groups[order[i]];
        PyObject *frames = hw_rframes_to_tuple(group_key(g, grp), (int)grp->key_len);
        if (frames == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        unsigned long long size = grp->size, count = hw_count_round(grp->est_blocks);
        PyObject *item;
        if (row == ROW_PEAK) {
            item = Py_BuildValue("(NKKK)", frames, size, count, (unsigned long long)grp->peak);
        }
        else if (row == ROW_AGES) {
            item = Py_BuildValue("(NKKN)", frames, size, count,
                                 age_tuple(&g->ages[(size_t)order[i] * HW_AGE_BUCKETS]));
        }
        else {
            item = Py_BuildValue("(NKK)", frames, size, count);
        }
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

PyObject *
hw_groups_statistics(hw_groups_t *g, Py_ssize_t limit)
{
    if (ensure_order(g) < 0) {
        return NULL;
    }
    return groups_to_list(g, g->order, clamp(limit, g->nlive), ROW_PLAIN);
}

PyObject *
hw_groups_ages(hw_groups_t *g, Py_ssize_t limit)
{
    if (g->ages == NULL) {
        PyErr_SetString(PyExc_ValueError, "ages need a grouping made with ages=True");
        return NULL;
    }
    if (ensure_order(g) < 0) {
        return NULL;
    }
    return groups_to_list(g, g->order, clamp(limit, g->nlive), ROW_AGES);
}

PyObject *
hw_groups_peaks(hw_groups_t *g, Py_ssize_t limit)
{
    uint32_t *order = new_order(g, g->ngroups, peak_cmp_desc);
    if (order == NULL) {
        return NULL;
    }
    PyObject *list = groups_to_list(g, order, clamp(limit, g->ngroups), ROW_PEAK);
    hw_free(HW_MEM_SNAPSHOT, order);
    return list;
}

typedef struct {
    const hw_rframe_t *key;
    uint32_t key_len;
    uint64_t size;
    uint64_t count;
    int64_t size_diff;
    int64_t count_diff;
} hw_diff_t;

static inline uint64_t
abs64(int64_t v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

static int
diff_cmp_desc(const void *pa, const void *pb)
{
    const hw_diff_t *a = pa, *b = pb;
#define DESC(x, y)              \
    if ((x) != (y)) {           \
        return (x) < (y) ? 1 : -1; \
    }
    DESC(abs64(a->size_diff), abs64(b->size_diff));
    DESC(a->size, b->size);
    DESC(abs64(a->count_diff), abs64(b->count_diff));
    DESC(a->count, b->count);
#undef DESC
    return -key_cmp(a->key, a->key_len, b->key, b->key_len);
}

static hw_diff_t
diff_of(const hw_groups_t *cur, const hw_group_t *grp, const hw_groups_t *old)
{
    hw_diff_t d;
    d.key = group_key(cur, grp);
    d.key_len = grp->key_len;
    d.size = grp->size;
    d.count = hw_count_round(grp->est_blocks);
    d.size_diff = (int64_t)d.size;
    d.count_diff = (int64_t)d.count;
    Py_ssize_t k = old != NULL ? find(old, grp->hash, d.key, d.key_len) : -1;
    if (k >= 0) {
        d.size_diff -= (int64_t)old->groups[k].size;
        d.count_diff -= (int64_t)hw_count_round(old->groups[k].est_blocks);
    }
    return d;
}

static PyObject *
diffs_to_list(const hw_diff_t *diffs, size_t n)
{
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        const hw_diff_t *d = &diffs[i];
        PyObject *frames = hw_rframes_to_tuple(d->key, (int)d->key_len);
        if (frames == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyObject *item = Py_BuildValue("(NKLKL)", frames, (unsigned long long)d->size,
                                       (long long)d->size_diff, (unsigned long long)d->count,
                                       (long long)d->count_diff);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

PyObject *
hw_groups_compare(hw_groups_t *cur, hw_groups_t *old, Py_ssize_t limit)
{
    hw_diff_t *diffs = hw_malloc(HW_MEM_SNAPSHOT, (cur->nlive + old->nlive + 1) * sizeof(hw_diff_t));
    if (diffs == NULL) {
        return PyErr_NoMemory();
    }
    size_t n = 0;
    for (size_t i = 0; i < cur->nlive; i++) {
        diffs[n++] = diff_of(cur, &cur->groups[i], old);
    }
    for (size_t i = 0; i < old->nlive; i++) {
        const hw_group_t *grp = &old->groups[i];
        if (find(cur, grp->hash, group_key(old, grp), grp->key_len) >= 0) {
            continue;
        }
        hw_diff_t *d = &diffs[n++];
        d->key = group_key(old, grp);
        d->key_len = grp->key_len;
        d->size = 0;
        d->count = 0;
        d->size_diff = -(int64_t)grp->size;
        d->count_diff = -(int64_t)hw_count_round(grp->est_blocks);
    }
    qsort(diffs, n, sizeof(hw_diff_t), diff_cmp_desc);
    PyObject *list = diffs_to_list(diffs, clamp(limit, n));
    hw_free(HW_MEM_SNAPSHOT, diffs);
    return list;
}

PyObject *
hw_groups_growth(hw_groups_t *cur, hw_groups_t *old, Py_ssize_t limit)
{
    if (ensure_order(cur) < 0) {
        return NULL;
    }
    size_t n = clamp(limit, cur->nlive);
    hw_diff_t *diffs = hw_malloc(HW_MEM_SNAPSHOT, (n + 1) * sizeof(hw_diff_t));
    if (diffs == NULL) {
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < n; i++) {
        diffs[i] = diff_of(cur, &cur->groups[cur->order[i]], old);
    }
    PyObject *list = diffs_to_list(diffs, n);
    hw_free(HW_MEM_SNAPSHOT, diffs);
    return list;
}
