/* Sampling: a Poisson process over allocated bytes, as tcmalloc and Go do.
 *
 * A countdown of the bytes to the next sample point, drawn from an
 * exponential distribution of mean sample_interval: one per thread for the
 * RAW domain, one shared under the GIL for MEM and OBJ (hw_gil_countdown).
 * The unsampled path is a subtraction and a compare: no lock, no frame walk,
 * and it never takes the GIL.  The per-thread countdowns live in the hooks'
 * thread state (thread.h); whether a block being freed was sampled, in the
 * sampled-block filter (filter.h).
 */
#ifndef HEAPWATCH_SAMPLING_H
#define HEAPWATCH_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "compat.h"
#include "thread.h"

/* Bumped by start() and in a forked child; atomic.  A thread whose rng_gen
 * differs reseeds and redraws its countdown (under a new interval, too). */
extern uint32_t hw_rng_generation;

/* The sampling fast path in one compare.  Odd (1) while it is closed: not
 * tracing, not recording or exact mode.  While it is open, an even value that
 * changes at every change of hw_tracer.hook_state or hw_rng_generation.  A
 * thread whose tls->fast equals it is recording in sample mode, seeded in the
 * current generation and not inside a hook, so its hooks need nothing else.
 * An even value says the state was open when it was published, so the
 * hooks' slow path may copy it to tls->fast once the thread is seeded: it
 * loads it before seeding, and a change published meanwhile leaves the copy
 * stale, never wrong.  While tls->reentrant is set, tls->fast is 0 (saved and restored
 * around it: a restored stale value is harmless).  Atomic. */
extern uint32_t hw_sample_gate;
#define HW_SAMPLE_GATE_CLOSED 1u

/* Recomputes hw_sample_gate after hook_state or the generation changed, and
 * opens or closes hw_gil_countdown with it.  GIL. */
void hw_sample_gate_publish(void);

/* The countdown of the MEM and OBJ domains, whose hooks run with the GIL:
 * one Poisson process for whichever thread holds it (the process is
 * memoryless, so sharing one changes no probability) and no thread-local
 * access on their fast path.  While sampling is open (hw_sample_gate even),
 * the bytes to the next sample point, drawn from its own stream; while it
 * is closed, 0, so that every MEM and OBJ call takes the slow path, which
 * reads the state.  A nested MEM or OBJ call (none of our paths makes one)
 * would be counted and passed through: the slow path checks tls->reentrant
 * before it records anything.  GIL; relaxed atomics, so that subinterpreters
 * with a GIL of their own (3.12+) race on it harmlessly. */
extern int64_t hw_gil_countdown;

static inline int64_t
hw_gil_countdown_load(void)
{
    return __atomic_load_n(&hw_gil_countdown, __ATOMIC_RELAXED);
}

static inline void
hw_gil_countdown_store(int64_t value)
{
    __atomic_store_n(&hw_gil_countdown, value, __ATOMIC_RELAXED);
}

/* Sample mode, open, GIL: consumes size bytes of the GIL's countdown; 1 if
 * this block is a sample point (the next one is then drawn). */
int hw_gil_sample_take(size_t size);

/* The MEM and OBJ fast path looks at nothing but hw_gil_countdown, not at
 * a wake-up (wake.h): a load and a branch more there cost json on 3.14, a
 * block every 50 ns, about half a percent.  While one is armed, the fast path
 * must still leave for the slow path, which polls it, every so often: the
 * countdown is then split, at most HW_WAKE_STRIDE bytes of it in
 * hw_gil_countdown and the rest held back, and the slow path refills it.
 * No byte is lost or counted twice: the sample points stay where they
 * were.  An allocating child reads the clock once per stride it
 * allocates. */
#define HW_WAKE_STRIDE 8192
/* GIL.  Caps hw_gil_countdown at HW_WAKE_STRIDE (on), or gives back what
 * the cap held (off). */
void hw_gil_countdown_cap(int on);

/* Whether the hooks record in sample mode (whatever the calling thread's
 * state): all a free needs to know before asking the filter. */
static inline int
hw_sampling_open(void)
{
    return !(__atomic_load_n(&hw_sample_gate, __ATOMIC_RELAXED) & HW_SAMPLE_GATE_CLOSED);
}

/* Whether the calling thread's hooks may take the sampling fast path. */
static inline int
hw_on_fast_path(const hw_tls_t *tls)
{
    return tls->fast == __atomic_load_n(&hw_sample_gate, __ATOMIC_RELAXED);
}

int hw_sample_slow(hw_tls_t *tls, size_t size);

/* Consumes size bytes of the calling thread's countdown; 1 if sampled. */
static inline int
hw_sample_take(hw_tls_t *tls, size_t size)
{
    tls->countdown -= (int64_t)size;
    if (HW_LIKELY(tls->countdown > 0) &&
        HW_LIKELY(tls->rng_gen == __atomic_load_n(&hw_rng_generation, __ATOMIC_RELAXED))) {
        return 0;
    }
    return hw_sample_slow(tls, size);
}

/* Reseeds the GIL's stream and makes every thread reseed at its next
 * allocation (start, fork child).  GIL. */
void hw_sampling_reseed_all(void);
/* For the fork child's only thread: forget the inherited countdown too. */
void hw_sampling_reset_this_thread(void);

#endif
