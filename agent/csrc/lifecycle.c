#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "lifecycle.h"

#include "hooks.h"
#include "interpose.h"
#include "reftracer.h"
#include "sampling.h"
#include "sync.h"
#include "tracer.h"

/* Tracing in the agent's profile, asked for the stdlib's semantics (the
 * drop-in's start() while the agent traces): from now on, re-stamps and the
 * whole depth; tracebacks recorded before keep what they had. */
static int
raise_profile(void)
{
    if (hw_load_int(&hw_tracer.profile) == HW_PROFILE_TRACEMALLOC) {
        return 0;
    }
    if (hw_load_int(&hw_tracer.mode) == HW_MODE_EXACT && hw_reftracer_install() < 0) {
        return -1;
    }
    hw_lock();
    __atomic_store_n(&hw_tracer.profile, HW_PROFILE_TRACEMALLOC, __ATOMIC_RELAXED);
    hw_tracer_publish_state_unlocked();
    hw_unlock();
    return 0;
}

int
hw_start(int max_nframe, int mode, uint64_t sample_interval, int profile)
{
    if (hw_load_int(&hw_tracer.tracing)) {
        /* As the stdlib: starting again keeps the running configuration,
         * but for a profile that asks for the stdlib's semantics. */
        return profile == HW_PROFILE_TRACEMALLOC ? raise_profile() : 0;
    }
    hw_lock();
    int err = hw_tracer_init_tables_unlocked();
    hw_unlock();
    if (err < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (hw_hooks_install(mode == HW_MODE_SAMPLE) < 0) {
        return -1;
    }
    /* Exact mode only: the tracer is called for every object created and
     * destroyed, a cost sample mode cannot afford (callgrind, 3.13: +3.3%
     * instructions on sampled churn and deep_stack, 8% of their untraced
     * work), for the few sampled blocks a free list hands back.  Nor the
     * agent's profile, which exports no re-stamped attribution. */
    if (mode == HW_MODE_EXACT && profile == HW_PROFILE_TRACEMALLOC &&
        hw_reftracer_install() < 0) {
        hw_hooks_uninstall();
        return -1;
    }
    hw_interpose_install();
    hw_sampling_reseed_all();
    hw_lock();
    __atomic_store_n(&hw_tracer.max_nframe, max_nframe, __ATOMIC_RELAXED);
    __atomic_store_n(&hw_tracer.profile, profile, __ATOMIC_RELAXED);
    __atomic_store_n(&hw_tracer.mode, mode, __ATOMIC_RELAXED);
    __atomic_store_n(&hw_tracer.sample_interval, sample_interval, __ATOMIC_RELAXED);
    __atomic_store_n(&hw_tracer.dropped, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&hw_tracer.recorded, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&hw_tracer.epoch, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&hw_tracer.tracing, 1, __ATOMIC_RELEASE);
    hw_tracer_publish_state_unlocked();
    hw_unlock();
    return 0;
}

void
hw_stop(void)
{
    if (!hw_load_int(&hw_tracer.tracing)) {
        return;
    }
    hw_lock();
    __atomic_store_n(&hw_tracer.tracing, 0, __ATOMIC_RELEASE);
    hw_tracer_publish_state_unlocked();
    __atomic_add_fetch(&hw_tracer.epoch, 1, __ATOMIC_RELAXED);
    hw_tracer_reset_tables_unlocked();
    hw_traces_reset_epoch_unlocked();
    hw_unlock();
    hw_interpose_uninstall();
    hw_reftracer_uninstall();
    hw_hooks_uninstall();
    hw_graveyard_drain();
}

void
hw_housekeeping(void)
{
    if (hw_load_int(&hw_tracer.tracing) &&
        hw_load_int(&hw_tracer.profile) == HW_PROFILE_TRACEMALLOC) {
        hw_reftracer_reclaim();
    }
    hw_tb_release_orphans();
    hw_interpose_refresh(); /* objects loaded other than by an import */
    hw_lock();
    hw_tracer_compact_tables_unlocked();
    hw_unlock();
}

void
hw_at_exit(void)
{
    /* From here on the hooks record nothing new and walk no frames; frees
     * keep untracking, which needs no interpreter state. */
    hw_lock();
    __atomic_store_n(&hw_tracer.recording, 0, __ATOMIC_RELEASE);
    hw_tracer_publish_state_unlocked();
    hw_unlock();
}
