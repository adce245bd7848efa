#include "compat.h" /* Python.h first: it sets _GNU_SOURCE, which link.h needs */

#include "interpose.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hooks.h"
#include "tracer.h"

#if defined(__x86_64__)
#  define HW_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#  define HW_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#  define HW_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#  define HW_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

#ifdef HW_R_JUMP_SLOT

enum { T_TRACK, T_UNTRACK, T_DLOPEN, T_COUNT };

static const char *const target_names[T_COUNT] = {
    "PyTraceMalloc_Track",
    "PyTraceMalloc_Untrack",
    "dlopen",
};

/* The functions as the dynamic linker bound them for heapwatch._core (whose
 * own GOT we never patch): what the wrappers call and what stop puts back.
 * Resolved when _core is loaded, never changed. */
static int (*const real_track)(unsigned int, uintptr_t, size_t) = PyTraceMalloc_Track;
static int (*const real_untrack)(unsigned int, uintptr_t) = PyTraceMalloc_Untrack;
static void *(*const real_dlopen)(const char *, int) = dlopen;

static int
track_wrapper(unsigned int domain, uintptr_t ptr, size_t size)
{
    int res = real_track(domain, ptr, size);
    hw_hooks_track(domain, ptr, size);
    return res;
}

static int
untrack_wrapper(unsigned int domain, uintptr_t ptr)
{
    hw_hooks_untrack(domain, ptr);
    return real_untrack(domain, ptr);
}

static void *
dlopen_wrapper(const char *file, int mode)
{
    void *handle = real_dlopen(file, mode);
    /* The import machinery calls dlopen with the GIL, which guards our
     * state; a call without it leaves the new objects to the next
     * snapshot.  The real dlopen sees heapwatch._core as its caller, which
     * matters only to a file name without a slash (it is then searched in
     * the caller's RUNPATH): CPython's imports always pass a path.  After
     * exit (not recording) the thread states may be gone: nothing to do. */
    if (handle != NULL && (hw_load_int(&hw_tracer.hook_state) & HW_STATE_RECORDING) &&
        hw_tstate_if_gil_held() != NULL) {
        int err = errno; /* mprotect may set it: see sync.h */
        hw_interpose_refresh();
        errno = err;
    }
    return handle;
}

static uintptr_t
original(int target)
{
    switch (target) {
    case T_TRACK:
        return (uintptr_t)real_track;
    case T_UNTRACK:
        return (uintptr_t)real_untrack;
    default:
        return (uintptr_t)real_dlopen;
    }
}

static uintptr_t
wrapper(int target)
{
    switch (target) {
    case T_TRACK:
        return (uintptr_t)track_wrapper;
    case T_UNTRACK:
        return (uintptr_t)untrack_wrapper;
    default:
        return (uintptr_t)dlopen_wrapper;
    }
}

/* The state below is guarded by the GIL. */
static int installed;
static size_t page_size;
/* dl_iterate_phdr()'s counts of objects ever loaded and unloaded at the
 * last walk: unchanged, nothing is new. */
static unsigned long long walked_adds, walked_subs;
/* Program headers of the objects patched since the last unload: an object
 * stays where it was loaded, so only new ones need a look.  Past SEEN_MAX
 * objects the rest are looked at on every walk (patching is idempotent). */
#define SEEN_MAX 1024
static const void *seen[SEEN_MAX];
static size_t nseen;

enum { WALK_PATCH, WALK_RESTORE, WALK_COUNT };

typedef struct {
    int what;
    int counters_checked;
    uintptr_t self;        /* an address inside heapwatch._core */
    uintptr_t interpreter; /* inside the object that defines PyTraceMalloc_Track */
    uintptr_t vdso;
    size_t count;
} walk_t;

/* What the dynamic section of an object tells us. */
typedef struct {
    const ElfW(Sym) *symtab;
    const char *strtab;
    size_t strsz;
    const ElfW(Rela) *tables[2]; /* PLT relocations, the others */
    size_t sizes[2];             /* bytes */
} dyn_t;

static int
segment_contains(const struct dl_phdr_info *info, const ElfW(Phdr) *ph, uintptr_t addr)
{
    return ph->p_type == PT_LOAD && addr - (info->dlpi_addr + ph->p_vaddr) < ph->p_memsz;
}

static int
object_contains(const struct dl_phdr_info *info, uintptr_t addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (segment_contains(info, &info->dlpi_phdr[i], addr)) {
            return 1;
        }
    }
    return 0;
}

/* glibc relocates the dynamic section's addresses in place (not the vDSO's,
 * which we skip); a loader that does not leaves offsets below the base. */
static uintptr_t
dyn_addr(const struct dl_phdr_info *info, ElfW(Addr) value)
{
    return value < info->dlpi_addr ? info->dlpi_addr + value : value;
}

static int
read_dynamic(const struct dl_phdr_info *info, dyn_t *d)
{
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        }
    }
    if (dyn == NULL) {
        return -1;
    }
    memset(d, 0, sizeof(*d));
    ElfW(Xword) pltrel = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB:
            d->symtab = (const ElfW(Sym) *)dyn_addr(info, dyn->d_un.d_ptr);
            break;
        case DT_STRTAB:
            d->strtab = (const char *)dyn_addr(info, dyn->d_un.d_ptr);
            break;
        case DT_STRSZ:
            d->strsz = dyn->d_un.d_val;
            break;
        case DT_JMPREL:
            d->tables[0] = (const ElfW(Rela) *)dyn_addr(info, dyn->d_un.d_ptr);
            break;
        case DT_PLTRELSZ:
            d->sizes[0] = dyn->d_un.d_val;
            break;
        case DT_PLTREL:
            pltrel = dyn->d_un.d_val;
            break;
        case DT_RELA:
            d->tables[1] = (const ElfW(Rela) *)dyn_addr(info, dyn->d_un.d_ptr);
            break;
        case DT_RELASZ:
            d->sizes[1] = dyn->d_un.d_val;
            break;
        default:
            break;
        }
    }
    if (pltrel != DT_RELA) {
        d->sizes[0] = 0; /* REL entries: not on the architectures we patch */
    }
    /* Some linkers count the PLT relocations in DT_RELASZ too. */
    uintptr_t plt = (uintptr_t)d->tables[0], rela = (uintptr_t)d->tables[1];
    if (d->sizes[0] != 0 && plt - rela < d->sizes[1]) {
        d->sizes[0] = 0;
    }
    return d->symtab != NULL && d->strtab != NULL ? 0 : -1;
}

/* The target a relocation's symbol names, or -1. */
static int
target_of(const dyn_t *d, const ElfW(Rela) *rel)
{
#if UINTPTR_MAX == UINT64_MAX
    unsigned long type = ELF64_R_TYPE(rel->r_info);
    size_t sym = ELF64_R_SYM(rel->r_info);
#else
    unsigned long type = ELF32_R_TYPE(rel->r_info);
    size_t sym = ELF32_R_SYM(rel->r_info);
#endif
    if ((type != HW_R_JUMP_SLOT && type != HW_R_GLOB_DAT) || sym == 0) {
        return -1;
    }
    size_t offset = d->symtab[sym].st_name;
    if (d->strsz != 0 && offset >= d->strsz) {
        return -1;
    }
    const char *name = d->strtab + offset;
    /* Most names fail here: the three targets start "Py" or "dl". */
    if (!((name[0] == 'P' && name[1] == 'y') || (name[0] == 'd' && name[1] == 'l'))) {
        return -1;
    }
    for (int t = 0; t < T_COUNT; t++) {
        if (strcmp(name, target_names[t]) == 0) {
            return t;
        }
    }
    return -1;
}

/* Whether the loader made addr's page read-only after relocating (RELRO):
 * it protects the pages wholly inside PT_GNU_RELRO. */
static int
in_relro(const struct dl_phdr_info *info, uintptr_t addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_GNU_RELRO) {
            continue;
        }
        uintptr_t start = (info->dlpi_addr + ph->p_vaddr) & ~(page_size - 1);
        uintptr_t end = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(page_size - 1);
        if (addr >= start && addr < end) {
            return 1;
        }
    }
    return 0;
}

static int
in_writable_segment(const struct dl_phdr_info *info, uintptr_t addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if ((ph->p_flags & PF_W) && segment_contains(info, ph, addr)) {
            return 1;
        }
    }
    return 0;
}

/* One aligned store, so that a thread calling through the entry meanwhile
 * jumps to the old or the new function, never elsewhere.  A RELRO page is
 * made writable for the store and read-only again, as the loader left it;
 * where that fails the entry stays as it was. */
static void
write_slot(const struct dl_phdr_info *info, uintptr_t *slot, uintptr_t value)
{
    uintptr_t addr = (uintptr_t)slot;
    if (in_relro(info, addr)) {
        void *page = (void *)(addr & ~(page_size - 1));
        if (mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0) {
            return;
        }
        __atomic_store_n(slot, value, __ATOMIC_RELEASE);
        (void)mprotect(page, page_size, PROT_READ);
        return;
    }
    if (in_writable_segment(info, addr)) {
        __atomic_store_n(slot, value, __ATOMIC_RELEASE);
    }
}

static void
visit_slot(walk_t *w, const struct dl_phdr_info *info, uintptr_t *slot, int target)
{
    uintptr_t now = __atomic_load_n(slot, __ATOMIC_RELAXED);
    switch (w->what) {
    case WALK_PATCH:
        /* Bound to the original, or not bound yet (a lazy PLT entry points
         * into its own object).  Another tool's wrapper is left alone. */
        if (now != wrapper(target) && (now == original(target) || object_contains(info, now))) {
            write_slot(info, slot, wrapper(target));
        }
        break;
    case WALK_RESTORE:
        if (now == wrapper(target)) {
            write_slot(info, slot, original(target));
        }
        break;
    default:
        w->count += now == wrapper(target);
        break;
    }
}

static void
visit_object(walk_t *w, const struct dl_phdr_info *info)
{
    dyn_t d;
    if (read_dynamic(info, &d) < 0) {
        return;
    }
    /* The interpreter's dlopen is the one its imports call. */
    int last = object_contains(info, w->interpreter) ? T_DLOPEN : T_UNTRACK;
    for (int k = 0; k < 2; k++) {
        size_t n = d.sizes[k] / sizeof(ElfW(Rela));
        for (size_t i = 0; i < n; i++) {
            const ElfW(Rela) *rel = &d.tables[k][i];
            int target = target_of(&d, rel);
            if (target >= 0 && target <= last) {
                visit_slot(w, info, (uintptr_t *)(info->dlpi_addr + rel->r_offset), target);
            }
        }
    }
}

static int
was_seen(const void *phdr)
{
    for (size_t i = 0; i < nseen; i++) {
        if (seen[i] == phdr) {
            return 1;
        }
    }
    return 0;
}

/* Called by dl_iterate_phdr() with the loader's lock held: it must not
 * load or unload anything. */
static int
visit(struct dl_phdr_info *info, size_t size, void *data)
{
    walk_t *w = data;
    int counters = size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs);
    if (w->what == WALK_PATCH && counters && !w->counters_checked) {
        w->counters_checked = 1;
        if (info->dlpi_adds == walked_adds && info->dlpi_subs == walked_subs && nseen != 0) {
            return 1; /* nothing loaded or unloaded since the last walk */
        }
        if (info->dlpi_subs != walked_subs) {
            nseen = 0; /* a new object may sit where an old one was */
        }
        walked_adds = info->dlpi_adds;
        walked_subs = info->dlpi_subs;
    }
    if (object_contains(info, w->self) || (w->vdso != 0 && object_contains(info, w->vdso))) {
        return 0;
    }
    if (w->what == WALK_PATCH && counters && was_seen(info->dlpi_phdr)) {
        return 0;
    }
    visit_object(w, info);
    if (w->what == WALK_PATCH && counters && nseen < SEEN_MAX) {
        seen[nseen++] = info->dlpi_phdr;
    }
    return 0;
}

static size_t
walk(int what)
{
    walk_t w = {
        .what = what,
        .self = (uintptr_t)visit,
        .interpreter = (uintptr_t)real_track,
        .vdso = (uintptr_t)getauxval(AT_SYSINFO_EHDR),
    };
    dl_iterate_phdr(visit, &w);
    return w.count;
}

void
hw_interpose_install(void)
{
    if (installed) {
        return;
    }
    if (page_size == 0) {
        page_size = (size_t)sysconf(_SC_PAGESIZE);
    }
    installed = 1;
    nseen = 0;
    walk(WALK_PATCH);
}

void
hw_interpose_uninstall(void)
{
    if (!installed) {
        return;
    }
    installed = 0;
    nseen = 0;
    walk(WALK_RESTORE);
}

void
hw_interpose_refresh(void)
{
    if (installed) {
        walk(WALK_PATCH);
    }
}

size_t
hw_interpose_count(void)
{
    return walk(WALK_COUNT);
}

#else /* an architecture whose relocations we do not patch */

void
hw_interpose_install(void)
{
}

void
hw_interpose_uninstall(void)
{
}

void
hw_interpose_refresh(void)
{
}

size_t
hw_interpose_count(void)
{
    return 0;
}

#endif
