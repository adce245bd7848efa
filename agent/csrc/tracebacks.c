#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "tracebacks.h"

#include <string.h>

#include "mem.h"
#include "pset.h"
#include "sync.h"
#include "thread.h"
#include "tracer.h"

/* All guarded by hw_tables_lock. */
static hw_pset_t tb_set;          /* interned tracebacks */
static hw_pset_t name_set;        /* raw names of frames captured with no_code_refs */
static hw_traceback_t **tb_ids;   /* id -> traceback; free ids hold (next << 1) | 1 */
static uint32_t tb_ids_cap;
static uint32_t tb_ids_bound = 1; /* id 0 is never handed out */
static uint32_t tb_ids_free;      /* head of the free list, 0 when empty */
static size_t idle_count;         /* interned tracebacks with idle set */
static size_t idle_kept;          /* idle ones the last sweep kept: a peak or totals */
static hw_tb_folded_t folded;     /* totals of the tracebacks swept (HW_TB_ALLOC_KEEP) */
static uint64_t tb_generation;    /* moves when a traceback is freed or rewritten (thread.h) */
static PyObject **graveyard;      /* code references to release with the GIL */
static size_t graveyard_len;
static size_t graveyard_cap;
static int initialized;

/* ---- raw names --------------------------------------------------------- */

typedef struct {
    uint32_t kind;
    size_t length;
    const void *data;
} name_key_t;

static uint64_t
hash_bytes(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * UINT64_C(0x100000001B3);
    }
    return h;
}

static int
name_eq(const void *record, const void *key)
{
    const hw_rawname_t *name = record;
    const name_key_t *k = key;
    return name->kind == k->kind && name->length == k->length &&
           memcmp(name->data, k->data, k->length * k->kind) == 0;
}

/* Finds or creates the raw name of a str read without the GIL.  The str
 * belongs to a code object of a frame of the calling thread, so it stays
 * alive, and a str's kind, length and data never change. */
static hw_rawname_t *
name_intern_unlocked(PyObject *str)
{
    name_key_t key;
    key.kind = (uint32_t)PyUnicode_KIND(str);
    key.length = (size_t)PyUnicode_GET_LENGTH(str);
    key.data = PyUnicode_DATA(str);
    uint64_t hash = hash_bytes(UINT64_C(0xCBF29CE484222325) ^ key.kind, key.data,
                               key.length * key.kind);
    hw_rawname_t *name = hw_pset_find(&name_set, hash, name_eq, &key);
    if (name != NULL) {
        return name;
    }
    name = hw_malloc(HW_MEM_TRACER, sizeof(hw_rawname_t) + key.length * key.kind);
    if (name == NULL) {
        return NULL;
    }
    name->hash = hash;
    name->refcnt = 0;
    name->detached = 0;
    name->kind = key.kind;
    name->length = key.length;
    memcpy(name->data, key.data, key.length * key.kind);
    if (hw_pset_add(&name_set, name) < 0) {
        hw_free(HW_MEM_TRACER, name);
        return NULL;
    }
    return name;
}

static void
name_drop_if_unused_unlocked(hw_rawname_t *name)
{
    if (name->refcnt == 0) {
        if (!name->detached) {
            hw_pset_remove(&name_set, name);
        }
        hw_free(HW_MEM_TRACER, name);
    }
}

static inline int
frame_is_raw(const hw_frame_t *frame)
{
    return (frame->key & HW_FRAME_RAW) != 0;
}

static inline hw_rawname_t *
frame_name(const hw_frame_t *frame)
{
    return (hw_rawname_t *)(frame->key & ~HW_FRAME_RAW);
}

/* Makes a code frame a raw one: (interned copy of the filename, line).  The
 * name is not counted yet: the caller counts it once every frame of the
 * traceback is converted, or calls drop_uncounted_names_unlocked().  Returns
 * -1 when out of memory, leaving the frame as it was. */
static int
frame_to_raw_unlocked(hw_frame_t *frame, PyCodeObject *code, int lineno)
{
    PyObject *filename = code->co_filename;
    hw_rawname_t *name = NULL;
    if (filename != NULL && PyUnicode_Check(filename)) {
        name = name_intern_unlocked(filename);
        if (name == NULL) {
            return -1;
        }
    }
    frame->key = name == NULL ? 0 : (uintptr_t)name | HW_FRAME_RAW;
    frame->lasti = lineno < 0 ? 0 : lineno;
    return 0;
}

/* Frees the names of frames[0..n) that no traceback counts, each once (two
 * frames may share one). */
static void
drop_uncounted_names_unlocked(const hw_frame_t *frames, int n)
{
    for (int j = 0; j < n; j++) {
        int first = frame_is_raw(&frames[j]);
        for (int k = 0; k < j && first; k++) {
            first = frames[k].key != frames[j].key;
        }
        if (first) {
            name_drop_if_unused_unlocked(frame_name(&frames[j]));
        }
    }
}

/* Rewrites the code frames of a capture made with no_code_refs as (raw name, line).  Returns -1 when out of
 * memory, after dropping the names it created. */
static HW_COLD int
unreferenced_to_raw_unlocked(hw_capture_t *cap)
{
    for (int i = 0; i < cap->nframe; i++) {
        hw_frame_t *frame = &cap->frames[i];
        PyCodeObject *code = (PyCodeObject *)frame->key;
        /* Reads the immutable line table only: safe without the GIL. */
        if (frame_to_raw_unlocked(frame, code, PyCode_Addr2Line(code, (int)frame->lasti)) < 0) {
            drop_uncounted_names_unlocked(cap->frames, i);
            return -1;
        }
    }
    return 0;
}

/* ---- interning --------------------------------------------------------- */

typedef struct {
    uint32_t domain;
    int nframe;
    uint16_t total_nframe;
    uint16_t route;
    const hw_frame_t *frames;
} tb_key_t;

static inline uint64_t
rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t
frame_word(const hw_frame_t *frame)
{
    /* Code pointers use the low 47 bits: the offset goes above them. */
    return frame->key + ((uint64_t)frame->lasti << 47);
}

/* Spreads the high bits into the low ones, which pick a slot. */
static inline uint64_t
hash_finish(uint64_t h)
{
    h ^= h >> 29;
    h *= UINT64_C(0xFF51AFD7ED558CCD);
    return h ^ (h >> 32);
}

/* One multiply per frame, in four independent chains: a single chain made
 * hashing 25 frames a sixth of the deep_stack benchmark at nframe 25.  One
 * frame (the default nframe) takes the short way. */
static inline uint64_t
hash_frames(const tb_key_t *key)
{
    const uint64_t mul = UINT64_C(0xFF51AFD7ED558CCD);
    const hw_frame_t *frames = key->frames;
    uint64_t h0 = UINT64_C(0x9E3779B97F4A7C15) ^ ((uint64_t)key->domain << 32) ^
                  ((uint64_t)key->nframe << 16) ^ key->total_nframe ^
                  ((uint64_t)key->route << 47);
    if (key->nframe == 1) {
        return hash_finish((h0 ^ frame_word(&frames[0])) * mul);
    }
    uint64_t h1 = UINT64_C(0xC2B2AE3D27D4EB4F);
    uint64_t h2 = UINT64_C(0x165667B19E3779F9);
    uint64_t h3 = UINT64_C(0x27D4EB2F165667C5);
    int i = 0;
    for (; i + 4 <= key->nframe; i += 4) {
        h0 = (h0 ^ frame_word(&frames[i])) * mul;
        h1 = (h1 ^ frame_word(&frames[i + 1])) * mul;
        h2 = (h2 ^ frame_word(&frames[i + 2])) * mul;
        h3 = (h3 ^ frame_word(&frames[i + 3])) * mul;
    }
    for (; i < key->nframe; i++) {
        h0 = (h0 ^ frame_word(&frames[i])) * mul;
    }
    return hash_finish(h0 ^ rotl64(h1, 16) ^ rotl64(h2, 32) ^ rotl64(h3, 48));
}

static int
tb_eq(const void *record, const void *key)
{
    const hw_traceback_t *tb = record;
    const tb_key_t *k = key;
    if (tb->domain != k->domain || tb->nframe != k->nframe || tb->total_nframe != k->total_nframe ||
        tb->route != k->route) {
        return 0;
    }
    if (k->nframe <= 4) {
        /* Short tracebacks (nframe 1 is the default): a call to memcmp costs
         * more than the comparison. */
        for (int i = 0; i < k->nframe; i++) {
            if (tb->frames[i].key != k->frames[i].key || tb->frames[i].lasti != k->frames[i].lasti) {
                return 0;
            }
        }
        return 1;
    }
    return memcmp(tb->frames, k->frames, sizeof(hw_frame_t) * (size_t)k->nframe) == 0;
}

/* hw_pset_find() specialised for tracebacks: this runs on every traced
 * allocation, and an inlined compare beats the generic callback. */
static inline hw_traceback_t *
tb_find_unlocked(uint64_t hash, const tb_key_t *key)
{
    for (size_t i = hash & tb_set.mask;; i = (i + 1) & tb_set.mask) {
        hw_traceback_t *tb = tb_set.slots[i];
        if (tb == NULL) {
            return NULL;
        }
        if (tb->hash == hash && tb_eq(tb, key)) {
            return tb;
        }
    }
}

int
hw_tb_init_unlocked(void)
{
    if (initialized) {
        return 0;
    }
    if (hw_pset_init(&tb_set, 1024) < 0) {
        return -1;
    }
    if (hw_pset_init(&name_set, 16) < 0) {
        hw_pset_fini(&tb_set);
        return -1;
    }
    initialized = 1;
    return 0;
}

static HW_COLD int
graveyard_push_unlocked(PyObject *obj)
{
    if (graveyard_len == graveyard_cap) {
        size_t cap = graveyard_cap ? graveyard_cap * 2 : 256;
        PyObject **grown = hw_realloc(HW_MEM_TRACER, graveyard, cap * sizeof(PyObject *));
        if (grown == NULL) {
            return -1; /* the reference leaks: better than a crash */
        }
        graveyard = grown;
        graveyard_cap = cap;
    }
    graveyard[graveyard_len++] = obj;
    return 0;
}

static int
id_alloc_unlocked(uint32_t *id)
{
    if (tb_ids_free != 0) {
        *id = tb_ids_free;
        tb_ids_free = (uint32_t)((uintptr_t)tb_ids[*id] >> 1);
        return 0;
    }
    if (tb_ids_bound == UINT32_MAX) {
        return -1;
    }
    if (tb_ids_bound >= tb_ids_cap) {
        uint32_t cap = tb_ids_cap ? tb_ids_cap * 2 : 1024;
        hw_traceback_t **grown = hw_realloc(HW_MEM_TRACER, tb_ids, cap * sizeof(*tb_ids));
        if (grown == NULL) {
            return -1;
        }
        tb_ids = grown;
        tb_ids_cap = cap;
    }
    *id = tb_ids_bound++;
    return 0;
}

static void
id_free_unlocked(uint32_t id)
{
    tb_ids[id] = (hw_traceback_t *)(((uintptr_t)tb_ids_free << 1) | 1);
    tb_ids_free = id;
}

hw_traceback_t *
hw_tb_by_id_unlocked(uint32_t id)
{
    if (id == 0 || id >= tb_ids_bound) {
        return NULL;
    }
    hw_traceback_t *tb = tb_ids[id];
    return ((uintptr_t)tb & 1) ? NULL : tb;
}

uint32_t
hw_tb_id_bound_unlocked(void)
{
    return tb_ids_bound;
}

size_t
hw_tb_count_unlocked(void)
{
    return tb_set.count;
}

/* Frees a traceback: its code references go to the graveyard.  Detached
 * tracebacks (id 0, see hw_tb_clear_unlocked) own no id any more. */
static HW_COLD void
tb_free_unlocked(hw_traceback_t *tb)
{
    tb_generation++;
    for (int i = 0; i < tb->nframe; i++) {
        hw_frame_t *frame = &tb->frames[i];
        if (frame_is_raw(frame)) {
            hw_rawname_t *name = frame_name(frame);
            name->refcnt--;
            name_drop_if_unused_unlocked(name);
        }
        else if (frame->key != 0) {
            (void)graveyard_push_unlocked((PyObject *)frame->key);
        }
    }
    if (tb->id != 0) {
        id_free_unlocked(tb->id);
    }
    hw_free(HW_MEM_TRACER, tb);
}

/* Interns a traceback seen for the first time.  Returns NULL when out of
 * memory. */
static HW_COLD hw_traceback_t *
tb_create_unlocked(const tb_key_t *key, uint64_t hash)
{
    hw_traceback_t *tb = hw_malloc(HW_MEM_TRACER, sizeof(hw_traceback_t) +
                                                      (sizeof(hw_frame_t) + sizeof(int32_t)) *
                                                          (size_t)key->nframe);
    if (tb == NULL) {
        return NULL;
    }
    memset(tb, 0, sizeof(*tb));
    tb->hash = hash;
    tb->domain = key->domain;
    tb->nframe = (uint16_t)key->nframe;
    tb->total_nframe = key->total_nframe;
    tb->route = key->route;
    memcpy(tb->frames, key->frames, sizeof(hw_frame_t) * (size_t)key->nframe);
    for (int i = 0; i < key->nframe; i++) {
        hw_tb_lines(tb)[i] = -1;
    }
    if (id_alloc_unlocked(&tb->id) < 0) {
        hw_free(HW_MEM_TRACER, tb);
        return NULL;
    }
    if (hw_pset_add(&tb_set, tb) < 0) {
        id_free_unlocked(tb->id);
        hw_free(HW_MEM_TRACER, tb);
        return NULL;
    }
    tb_ids[tb->id] = tb;
    for (int i = 0; i < tb->nframe; i++) {
        hw_frame_t *frame = &tb->frames[i];
        if (frame_is_raw(frame)) {
            frame_name(frame)->refcnt++;
        }
        else if (frame->key != 0) {
            /* Captured with the GIL held (frames captured with no_code_refs are raw by now). */
            Py_INCREF((PyObject *)frame->key);
        }
    }
    return tb;
}

/* A traceback taken for a new trace is in use again: no longer idle. */
static inline void
tb_wake_unlocked(hw_traceback_t *tb)
{
    if (tb->idle) {
        tb->idle = 0;
        idle_count--;
    }
}

/* The interned traceback of key, created if new; NULL when out of memory. */
static inline hw_traceback_t *
find_or_create_unlocked(const tb_key_t *key, uint64_t hash)
{
    hw_traceback_t *tb = tb_find_unlocked(hash, key);
    if (HW_UNLIKELY(tb == NULL)) {
        return tb_create_unlocked(key, hash);
    }
    tb_wake_unlocked(tb);
    return tb;
}

/* The rare parts of interning: a capture without frames or without the
 * GIL, the first traceback ever. */
static HW_COLD hw_traceback_t *
intern_slow_unlocked(uint32_t domain, hw_capture_t *cap)
{
    static const hw_frame_t unknown = {0, 0};
    tb_key_t key;
    key.domain = domain;
    key.route = cap->route;
    if (cap->nframe == 0) {
        /* As the stdlib: no complete frame gives "<unknown>":0, depth 1. */
        key.frames = &unknown;
        key.nframe = 1;
        key.total_nframe = 1;
    }
    else {
        if (cap->no_code_refs && unreferenced_to_raw_unlocked(cap) < 0) {
            return NULL;
        }
        key.frames = cap->frames;
        key.nframe = cap->nframe;
        key.total_nframe = cap->total_nframe;
    }
    hw_traceback_t *tb = NULL;
    if (initialized || hw_tb_init_unlocked() == 0) {
        tb = find_or_create_unlocked(&key, hash_frames(&key));
    }
    if (tb == NULL && cap->no_code_refs) {
        for (int i = 0; i < cap->nframe; i++) {
            if (frame_is_raw(&cap->frames[i])) {
                name_drop_if_unused_unlocked(frame_name(&cap->frames[i]));
            }
        }
    }
    return tb;
}

/* Where a traceback goes in a thread's cache: by its innermost frame. */
static inline uint32_t
cache_way(const hw_frame_t *innermost)
{
    return (uint32_t)((frame_word(innermost) * UINT64_C(0x9E3779B97F4A7C15)) >>
                      (64 - HW_TBCACHE_BITS));
}

hw_traceback_t *
hw_tb_intern_unlocked(uint32_t domain, hw_capture_t *cap)
{
    if (HW_UNLIKELY(cap->nframe == 0 || cap->no_code_refs || !initialized)) {
        return intern_slow_unlocked(domain, cap);
    }
    tb_key_t key = {domain, cap->nframe, cap->total_nframe, cap->route, cap->frames};
    /* A thread allocates from the same few places again and again: its
     * cache spares the hash (25 frames cost a tenth of deep_stack at
     * nframe 25) and the probe. */
    hw_thread_t *thread = hw_thread_if_any();
    uint32_t way = cache_way(&cap->frames[0]);
    hw_traceback_t *tb;
    if (thread != NULL && thread->tbcache[way].gen == tb_generation &&
        (tb = thread->tbcache[way].tb) != NULL && tb_eq(tb, &key)) {
        tb_wake_unlocked(tb);
        return tb;
    }
    tb = find_or_create_unlocked(&key, hash_frames(&key));
    if (tb != NULL && thread != NULL) {
        thread->tbcache[way].tb = tb;
        thread->tbcache[way].gen = tb_generation;
    }
    return tb;
}

static void
tb_unintern_unlocked(hw_traceback_t *tb)
{
    hw_pset_remove(&tb_set, tb);
    tb_free_unlocked(tb);
}

/* Frees an idle traceback, its allocation totals folded first. */
static void
tb_drop_unlocked(hw_traceback_t *tb)
{
    if (tb->alloc_blocks != 0) {
        folded.alloc_size += tb->alloc_size;
        folded.alloc_blocks += tb->alloc_blocks;
        folded.tracebacks++;
    }
    tb_unintern_unlocked(tb);
}

hw_tb_folded_t
hw_tb_folded_unlocked(void)
{
    return folded;
}

HW_COLD void
hw_tb_sweep_unlocked(void)
{
    if (idle_count == 0) {
        return;
    }
    size_t kept = 0;
    size_t kept_for_totals = 0;
    for (uint32_t id = 1; id < tb_ids_bound; id++) {
        hw_traceback_t *tb = tb_ids[id];
        if (!((uintptr_t)tb & 1) && tb->idle) {
            if (hw_tb_holds_peak_unlocked(tb)) {
                kept++;
            }
            else if (tb->alloc_blocks != 0 && kept_for_totals < HW_TB_ALLOC_KEEP) {
                kept_for_totals++;
                kept++;
            }
            else {
                tb_drop_unlocked(tb);
            }
        }
    }
    idle_count = kept;
    idle_kept = kept;
}

void
hw_tb_pin_unlocked(hw_traceback_t *tb)
{
    tb_wake_unlocked(tb);
    tb->pins++;
}

HW_COLD void
hw_tb_peak_stamps_reset_unlocked(void)
{
    for (uint32_t id = 1; id < tb_ids_bound; id++) {
        hw_traceback_t *tb = hw_tb_by_id_unlocked(id);
        if (tb != NULL) {
            tb->peak_gen = 0;
        }
    }
}

__attribute__((noinline)) void
hw_tb_unused_unlocked(hw_traceback_t *tb)
{
    if (tb->id == 0) {
        tb_free_unlocked(tb); /* detached by clear_traces(): its snapshot let go */
        return;
    }
    tb->idle = 1;
    idle_count++;
    /* Amortized: a sweep follows at least 4096 tracebacks gone idle, and at
     * least half as many as are interned, since the last one (whose cost is
     * a pass over the ids), whatever it had to keep. */
    if (idle_count > idle_kept + 4096 && (idle_count - idle_kept) * 2 > tb_set.count) {
        hw_tb_sweep_unlocked();
    }
}

void
hw_tb_clear_unlocked(void)
{
    if (!initialized) {
        return;
    }
    tb_generation++;
    /* Pinned tracebacks stay alive for their snapshots, detached from the
     * tables (id 0); the last unpin frees them.  Their raw names are detached
     * too: they leave name_set now and are freed with their last frame. */
    for (uint32_t id = 1; id < tb_ids_bound; id++) {
        hw_traceback_t *tb = tb_ids[id];
        if ((uintptr_t)tb & 1) {
            continue;
        }
        if (tb->pins != 0) {
            tb->id = 0;
            tb->ntraces = 0;
            tb->pending = 0; /* the queue was dropped first */
            tb->size = 0;
            tb->est_blocks = 0;
            tb->peak_size = 0;
            tb->alloc_size = 0;
            tb->alloc_blocks = 0;
        }
        else {
            tb->id = 0;
            tb_free_unlocked(tb);
        }
    }
    for (size_t i = 0; i <= name_set.mask && name_set.slots != NULL; i++) {
        hw_rawname_t *name = name_set.slots[i];
        if (name != NULL) {
            name->detached = 1;
        }
    }
    hw_free(HW_MEM_TRACER, tb_ids);
    tb_ids = NULL;
    tb_ids_cap = 0;
    tb_ids_bound = 1;
    tb_ids_free = 0;
    idle_count = 0;
    idle_kept = 0;
    memset(&folded, 0, sizeof(folded));
    hw_pset_fini(&tb_set);
    hw_pset_fini(&name_set);
    initialized = 0;
}

/* ---- orphaned code objects --------------------------------------------- */


typedef struct {
    uintptr_t code; /* 0: empty slot */
    size_t refs;    /* frames of interned tracebacks naming it */
} code_refs_t;

static code_refs_t *
code_refs_slot(code_refs_t *table, size_t mask, uintptr_t code)
{
    size_t i = (size_t)(((uint64_t)code >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 32) & mask;
    while (table[i].code != 0 && table[i].code != code) {
        i = (i + 1) & mask;
    }
    return &table[i];
}

static inline int
frame_is_code(const hw_frame_t *frame)
{
    return frame->key != 0 && !frame_is_raw(frame);
}

static int
code_is_orphan(code_refs_t *table, size_t mask, const hw_frame_t *frame)
{
    /* GIL held: no other thread changes the count while we compare. */
    return frame_is_code(frame) &&
           (size_t)Py_REFCNT((PyObject *)frame->key) == code_refs_slot(table, mask, frame->key)->refs;
}

/* Rewrites tb's orphan frames as (raw name, line) and queues their code
 * references for release.  On failure (out of memory) tb is left as it was:
 * the code objects stay alive until a later pass.  Code objects that are gone
 * can leave equal tracebacks behind (the same source compiled twice): the
 * set holds both, lookups find either, and each is freed once unused. */
static void
tb_unorphan_unlocked(hw_traceback_t *tb, code_refs_t *table, size_t mask)
{
    hw_frame_t *frames = hw_malloc(HW_MEM_TRACER, sizeof(hw_frame_t) * tb->nframe);
    if (frames == NULL) {
        return;
    }
    memcpy(frames, tb->frames, sizeof(hw_frame_t) * tb->nframe);
    int32_t *lines = hw_tb_lines(tb);
    for (int i = 0; i < tb->nframe; i++) {
        if (!code_is_orphan(table, mask, &frames[i])) {
            continue;
        }
        PyCodeObject *code = (PyCodeObject *)frames[i].key;
        int lineno = lines[i] >= 0 ? lines[i] : PyCode_Addr2Line(code, (int)frames[i].lasti);
        if (frame_to_raw_unlocked(&frames[i], code, lineno) < 0) {
            drop_uncounted_names_unlocked(frames, i);
            hw_free(HW_MEM_TRACER, frames);
            return;
        }
    }
    hw_pset_remove(&tb_set, tb); /* its hash changes */
    tb_generation++;
    for (int i = 0; i < tb->nframe; i++) {
        if (frame_is_code(&tb->frames[i]) && !frame_is_code(&frames[i])) {
            (void)graveyard_push_unlocked((PyObject *)tb->frames[i].key);
            if (frame_is_raw(&frames[i])) {
                frame_name(&frames[i])->refcnt++;
            }
            lines[i] = -1;
        }
    }
    memcpy(tb->frames, frames, sizeof(hw_frame_t) * tb->nframe);
    hw_free(HW_MEM_TRACER, frames);
    tb_key_t key = {tb->domain, tb->nframe, tb->total_nframe, tb->route, tb->frames};
    tb->hash = hash_frames(&key);
    /* Out of memory, it stays out of the set: freed once unused all the same. */
    (void)hw_pset_add(&tb_set, tb);
}

/* Counts the frames naming each code object, then frees or rewrites the
 * tracebacks that name an orphan.  Returns how many. */
static size_t
release_orphans_unlocked(code_refs_t *table, size_t mask)
{
    /* Detached tracebacks (id 0) are not counted: the references they hold
     * make their code objects look alive, which errs on the safe side. */
    for (uint32_t id = 1; id < tb_ids_bound; id++) {
        hw_traceback_t *tb = hw_tb_by_id_unlocked(id);
        for (int i = 0; tb != NULL && i < tb->nframe; i++) {
            if (frame_is_code(&tb->frames[i])) {
                code_refs_t *slot = code_refs_slot(table, mask, tb->frames[i].key);
                slot->code = tb->frames[i].key;
                slot->refs++;
            }
        }
    }
    size_t released = 0;
    for (uint32_t id = 1; id < tb_ids_bound; id++) {
        hw_traceback_t *tb = hw_tb_by_id_unlocked(id);
        for (int i = 0; tb != NULL && i < tb->nframe; i++) {
            if (code_is_orphan(table, mask, &tb->frames[i])) {
                released++;
                /* Totals outlive their code (a sweep caps them): an
                 * exec()'d module's sites still show what they allocated. */
                if (tb->idle && !hw_tb_holds_peak_unlocked(tb) && tb->alloc_blocks == 0) {
                    tb->idle = 0;
                    idle_count--;
                    tb_unintern_unlocked(tb);
                }
                else {
                    tb_unorphan_unlocked(tb, table, mask);
                }
                break;
            }
        }
    }
    return released;
}

/* One pass: returns how many tracebacks lost a code object plus how many
 * references the graveyard released. */
static size_t
release_orphans_once(void)
{
    size_t released = 0;
    hw_lock();
    size_t nframes = 0;
    for (uint32_t id = 1; id < tb_ids_bound; id++) {
        hw_traceback_t *tb = hw_tb_by_id_unlocked(id);
        nframes += tb == NULL ? 0 : tb->nframe;
    }
    size_t cap = 16;
    while (cap < 2 * nframes) {
        cap *= 2;
    }
    /* Out of memory (or nothing interned), the graveyard is drained all the
     * same: orphans wait for a later pass. */
    code_refs_t *table = nframes ? hw_calloc(HW_MEM_TRACER, cap, sizeof(code_refs_t)) : NULL;
    if (table != NULL) {
        released = release_orphans_unlocked(table, cap - 1);
    }
    hw_unlock();
    hw_free(HW_MEM_TRACER, table);
    return released + hw_graveyard_drain();
}

/* Releasing one code object can orphan others: a module's code holds its
 * functions' code in co_consts, so they become orphans only once it is gone.
 * A few passes follow such chains; whatever is left waits for the next call. */
#define HW_ORPHAN_PASSES 8

void
hw_tb_release_orphans(void)
{
    for (int pass = 0; pass < HW_ORPHAN_PASSES; pass++) {
        if (release_orphans_once() == 0) {
            break;
        }
    }
}

size_t
hw_graveyard_len_unlocked(void)
{
    return graveyard_len;
}

size_t
hw_graveyard_drain(void)
{
    hw_lock();
    hw_tb_sweep_unlocked();
    PyObject **dead = graveyard;
    size_t n = graveyard_len;
    graveyard = NULL;
    graveyard_len = 0;
    graveyard_cap = 0;
    hw_unlock();
    for (size_t i = 0; i < n; i++) {
        Py_DECREF(dead[i]);
    }
    hw_free(HW_MEM_TRACER, dead);
    return n;
}
