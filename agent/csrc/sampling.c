#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "sampling.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sys/random.h>
#include <time.h>

#include "tracer.h"

uint32_t hw_sample_gate = HW_SAMPLE_GATE_CLOSED;
/* Source of the even values of hw_sample_gate; atomic. */
static uint32_t fast_counter;

int64_t hw_gil_countdown;
/* The stream hw_gil_countdown is drawn from, reseeded with the others (a
 * new generation); GIL. */
static uint64_t gil_rng;
/* The bytes of the GIL's countdown that the cap holds back from
 * hw_gil_countdown, and whether it applies (hw_gil_countdown_cap).  As
 * hw_gil_countdown: GIL, relaxed atomics. */
static int64_t gil_held_back;
static int gil_capped;

/* Makes left the GIL's whole countdown, capped or not. */
static void
gil_countdown_set(int64_t left)
{
    int64_t held = 0;
    if (hw_load_int(&gil_capped) && left > HW_WAKE_STRIDE) {
        held = left - HW_WAKE_STRIDE;
        left = HW_WAKE_STRIDE;
    }
    __atomic_store_n(&gil_held_back, held, __ATOMIC_RELAXED);
    hw_gil_countdown_store(left);
}

static int64_t
gil_countdown_whole(void)
{
    return hw_gil_countdown_load() + __atomic_load_n(&gil_held_back, __ATOMIC_RELAXED);
}

void
hw_gil_countdown_cap(int on)
{
    int64_t whole = gil_countdown_whole();
    __atomic_store_n(&gil_capped, on, __ATOMIC_RELAXED);
    gil_countdown_set(whole);
}

/* Starts at 1 so that a fresh thread (rng_gen 0) always seeds. */
uint32_t hw_rng_generation = 1;
static uint64_t hw_rng_seed;
/* Distinguishes threads seeded in the same generation: pthread_self() is
 * reused by successive short-lived threads, which must not share a stream
 * (tests/core/test_sampling.py::test_short_lived_threads). */
static uint64_t hw_seed_sequence;

static uint64_t
mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= UINT64_C(0xBF58476D1CE4E5B9);
    x ^= x >> 27;
    x *= UINT64_C(0x94D049BB133111EB);
    x ^= x >> 31;
    return x;
}

static uint64_t
next_random(uint64_t *rng)
{
    /* xorshift64*: small state, fast, plenty for sample spacing. */
    uint64_t x = *rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    return x * UINT64_C(0x2545F4914F6CDD1D);
}

/* A stream of its own for a thread (identity, a sequence number told apart
 * from every other thread's) or for the GIL's countdown (identity 0). */
static uint64_t
seed_stream(uint64_t identity, uint32_t gen)
{
    uint64_t seed = __atomic_load_n(&hw_rng_seed, __ATOMIC_RELAXED);
    uint64_t sequence = __atomic_add_fetch(&hw_seed_sequence, 1, __ATOMIC_RELAXED);
    return mix64(seed ^ mix64(identity ^ (sequence << 32)) ^ ((uint64_t)gen << 1)) | 1;
}

static int64_t
draw_countdown(uint64_t *rng)
{
    double interval = (double)__atomic_load_n(&hw_tracer.sample_interval, __ATOMIC_RELAXED);
    /* u in (0, 1]: -log(u) is finite.  log1p(u - 1), not log(u): glibc 2.29
     * gave log a new symbol version, which would raise the wheels' manylinux
     * tag above RHEL 8's glibc 2.28.  u is k * 2^-53, so u - 1 is exact and
     * the two are the same function of the same argument. */
    double u = (double)((next_random(rng) >> 11) + 1) * (1.0 / 9007199254740992.0);
    double bytes = -log1p(u - 1.0) * interval;
    if (bytes < 1.0) {
        return 1;
    }
    if (bytes > 9.0e18) {
        return INT64_MAX;
    }
    return (int64_t)bytes;
}

void
hw_sample_gate_publish(void)
{
    const int open = HW_STATE_TRACING | HW_STATE_RECORDING | HW_STATE_SAMPLE;
    uint32_t word = HW_SAMPLE_GATE_CLOSED;
    int64_t gil_countdown = 0;
    if ((hw_load_int(&hw_tracer.hook_state) & open) == open) {
        do { /* never 0: a fresh thread's tls->fast */
            word = __atomic_add_fetch(&fast_counter, 2, __ATOMIC_RELAXED);
        } while (word == 0);
        /* Opening forgets the countdown left from before. */
        gil_countdown = draw_countdown(&gil_rng);
    }
    gil_countdown_set(gil_countdown);
    __atomic_store_n(&hw_sample_gate, word, __ATOMIC_RELEASE);
}

void
hw_sampling_reseed_all(void)
{
    uint64_t seed;
    int err = errno; /* called in a forked child too: see sync.h */
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t)sizeof(seed)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32);
    }
    errno = err;
    __atomic_store_n(&hw_rng_seed, seed, __ATOMIC_RELAXED);
    uint32_t gen = __atomic_add_fetch(&hw_rng_generation, 1, __ATOMIC_RELEASE);
    gil_rng = seed_stream(0, gen);
    hw_sample_gate_publish();
}

void
hw_sampling_reset_this_thread(void)
{
    hw_tls.countdown = 0;
    hw_tls.rng_gen = 0;
    hw_tls.fast = 0;
}

int
hw_sample_slow(hw_tls_t *tls, size_t size)
{
    uint32_t gen = __atomic_load_n(&hw_rng_generation, __ATOMIC_ACQUIRE);
    if (tls->rng_gen != gen) {
        tls->rng = seed_stream((uint64_t)pthread_self(), gen);
        tls->rng_gen = gen;
        /* The countdown left from before is not from this stream. */
        tls->countdown = draw_countdown(&tls->rng) - (int64_t)size;
        if (tls->countdown > 0) {
            return 0;
        }
    }
    /* The process is memoryless: the next point is drawn afresh from the
     * end of this block. */
    tls->countdown = draw_countdown(&tls->rng);
    return 1;
}

int
hw_gil_sample_take(size_t size)
{
    int64_t left = gil_countdown_whole();
    if (left > 0 && size < (uint64_t)left) {
        gil_countdown_set(left - (int64_t)size);
        return 0;
    }
    gil_countdown_set(draw_countdown(&gil_rng));
    return 1;
}
