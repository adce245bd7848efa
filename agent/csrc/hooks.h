/* The allocator hooks: PyMem_SetAllocator wrappers for the RAW, MEM and OBJ
 * domains.
 *
 * Each hook delegates to the allocator it wraps (hw_saved) and records the
 * block.  Our hooks go into the chain with the wrapped allocator's ctx as
 * their own (install_set), so MEM's and OBJ's pass on the ctx they are
 * called with; RAW's, which may be called without the GIL while the chain
 * is being swapped, reads the saved one.
 * A thread-local flag makes nested calls pass through: pymalloc serves large
 * requests with PyMem_RawMalloc, so an OBJ allocation would otherwise be
 * traced a second time by the RAW hook.
 *
 * Failure policy: a hook never raises, never fails an allocation that the
 * wrapped allocator served, and never takes the GIL.  MEM and OBJ hooks run
 * with the GIL (the API's contract); RAW hooks may run without it, and then
 * capture the thread's frames without taking references (see tracebacks.h).
 */
#ifndef HEAPWATCH_HOOKS_H
#define HEAPWATCH_HOOKS_H

#include <stddef.h>
#include <stdint.h>

/* GIL held, nothing traced.  Puts our hooks in the chain, or keeps them
 * there, fit for the mode about to start (sampling or not).  Returns -1 with
 * an exception set when they cannot go in safely: the stdlib tracer is
 * running (and would remove them on stop), or exact tracing is asked of
 * sampling hooks buried under another tracer. */
int hw_hooks_install(int sampling);
/* GIL held.  Removes our hooks if they are still on top of the chain;
 * otherwise (another hook was installed over ours) they stay in the chain,
 * passing through, so that hook keeps working. */
void hw_hooks_uninstall(void);
/* 1 if our hooks are in the allocator chain. */
int hw_hooks_installed(void);
/* GIL held, not inside a hook.  If block has a trace in the hooks' table,
 * gives it the calling thread's traceback (the reference tracer's re-stamp
 * of a block reused from a free list). */
void hw_hooks_restamp(void *block);
/* Registers the fork handlers once.  Returns -1 with an exception set. */
int hw_hooks_init_once(void);
/* What the hooks do for a block an extension reports through
 * PyTraceMalloc_Track() / PyTraceMalloc_Untrack() (interpose.h), with or
 * without the GIL: recorded in its domain with the caller's traceback
 * (sampled like any block in sample mode), or forgotten.  Never raise. */
void hw_hooks_track(unsigned int domain, uintptr_t ptr, size_t size);
void hw_hooks_untrack(unsigned int domain, uintptr_t ptr);
/* Whether the blocks the calling thread allocates from now on are recorded
 * (1, every thread's default) or not (0: one of heapwatch's own threads);
 * returns the previous setting.  Frees, and the sampling decisions, are
 * unchanged (see hw_tls_t.own). */
int hw_hooks_set_thread_traced(int traced);

#endif
