/* PyTraceMalloc_Track() and PyTraceMalloc_Untrack() seen by heapwatch.
 *
 * Extension modules that allocate outside the PyMem API report their blocks
 * through those two functions (numpy's array data, in domain 389047), and
 * only the stdlib tracer listens to them.  While heapwatch traces, every
 * loaded ELF object that imports them has its GOT entries for them pointed at
 * our wrappers, which call the original (so the stdlib tracer keeps working)
 * and then record or forget the block like a hook does (hw_hooks_track).
 *
 * Objects loaded later are covered too: the interpreter's own GOT entry for
 * dlopen (the one its import machinery calls) is wrapped the same way, and
 * each dlopen that returns patches the objects it brought in before the
 * module's init function runs.  Objects loaded by other means (ctypes, or a
 * library's own dlopen) are patched at the next snapshot or drain.  Stopping
 * puts every entry back.  See docs/design/core.md, "Blocks reported by
 * extensions".
 *
 * x86-64 and AArch64 (ELF RELA relocations); elsewhere nothing is patched.
 * Every function here expects the GIL held, which guards the state in
 * interpose.c: the dlopen wrapper refreshes only when its caller holds it.
 */
#ifndef HEAPWATCH_INTERPOSE_H
#define HEAPWATCH_INTERPOSE_H

#include <stddef.h>

/* Patches every loaded object; from then on, those loaded later. */
void hw_interpose_install(void);
/* Puts back every entry we patched. */
void hw_interpose_uninstall(void);
/* Patches the objects loaded since the last call, if installed.  Costs one
 * dl_iterate_phdr() callback when nothing was loaded. */
void hw_interpose_refresh(void);
/* GOT entries that point at our wrappers now (tests). */
size_t hw_interpose_count(void);

#endif
