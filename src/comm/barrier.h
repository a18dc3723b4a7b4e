/*
 * comm/barrier.h — private: the spin barrier and abort flag of the
 * reduction engine.
 *
 * A generation-counting barrier on C11 atomics.  Each arriving thread reads
 * the generation, then increments the arrival counter; the last to arrive
 * resets the counter and bumps the generation (release), the others spin
 * until they see the generation change (acquire).  The acq_rel increments
 * form a release sequence, so the last arriver sees every write made by
 * the others before they arrived, and its release store hands all of them
 * to every waiter: whatever a worker wrote before the barrier is visible to
 * every worker after it.  No thread-local sense is needed, so any thread
 * may arrive for any worker.
 *
 * Counter, generation and abort flag each sit on their own 64-byte line:
 * arrivals (writes to the counter) do not evict the line the waiters spin
 * on, and no unrelated data shares either.
 *
 * Waiting spins with a pause instruction and checks the abort flag at every
 * turn; after ST_BARRIER_SPINS turns it also yields the CPU at every turn,
 * so that an oversubscribed run (more workers than cores: tests, laptops)
 * still progresses.  Workers pinned one per core never wait that long at
 * the reduction's own barriers, which follow one another within a step.
 *
 * A blocking barrier (st_spin_barrier_init's blocking, a sizing run's
 * engines: many more workers than cores, and no steps) does not spin: a
 * waiter sleeps on a wake word (a futex) that the last arriver, after the
 * generation, and an abort both advance, so that neither can slip in
 * between a waiter's look and its sleep, and no waiter needs a timeout to
 * notice an abort.  The spinning barrier reads that flag on the line of
 * n, which every arrival reads anyway.
 *
 * After an abort the counters are left as they are: the barrier (and the
 * st_comm that owns it) can only be destroyed.
 */
#ifndef SUBTRAIN_COMM_BARRIER_H
#define SUBTRAIN_COMM_BARRIER_H

#include <limits.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>

/* Pause turns before a waiter starts yielding the CPU.  A test may lower
 * it (defined before this header is included) so that rounds with more
 * threads than cores yield sooner and run faster. */
#ifndef ST_BARRIER_SPINS
#define ST_BARRIER_SPINS 4096
#endif

/* Run by the last arriver between its two stores: nothing, unless a test
 * defines it before including this header.  tests/test_comm_barrier.c
 * yields the CPU there, which opens wide the window in which a woken
 * waiter could arrive for the next round: with the stores in the wrong
 * order (generation first) that arrival is erased and the round never
 * ends. */
#ifndef ST_BARRIER_RELEASE_HOOK
#define ST_BARRIER_RELEASE_HOOK() ((void)0)
#endif

typedef struct st_spin_barrier {
    alignas(64) atomic_uint arrived;
    alignas(64) atomic_uint generation;
    alignas(64) atomic_int aborted;
    alignas(64) atomic_uint wake;   /* blocking: advanced by each release and abort */
    alignas(64) unsigned n;   /* participants, constant */
    int blocking;             /* waiters sleep (futex) instead of spinning */
} st_spin_barrier;

static inline void st_cpu_relax(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif defined(__GNUC__) && defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static inline void st_spin_barrier_init(st_spin_barrier *b, unsigned n, int blocking)
{
    atomic_init(&b->arrived, 0u);
    atomic_init(&b->generation, 0u);
    atomic_init(&b->aborted, 0);
    atomic_init(&b->wake, 0u);
    b->n = n;
    b->blocking = blocking;
}

/* The wake word advanced, then every waiter sleeping on it woken. */
static inline void st_barrier_wake(st_spin_barrier *b)
{
    atomic_fetch_add_explicit(&b->wake, 1u, memory_order_seq_cst);
    syscall(SYS_futex, (unsigned *)&b->wake, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void st_spin_barrier_abort(st_spin_barrier *b)
{
    atomic_store_explicit(&b->aborted, 1, memory_order_release);
    if (b->blocking)
        st_barrier_wake(b);
}

/* A blocking barrier's waiter: sleeps while the generation is gen.  The
 * wake word is read before the generation and the abort flag: a release
 * or an abort after that look changes the word, and the sleep on its old
 * value returns at once. */
static inline int st_barrier_sleep(st_spin_barrier *b, unsigned gen)
{
    for (;;) {
        const unsigned w = atomic_load_explicit(&b->wake, memory_order_seq_cst);
        if (atomic_load_explicit(&b->generation, memory_order_seq_cst) != gen)
            return 0;
        if (atomic_load_explicit(&b->aborted, memory_order_seq_cst))
            return -1;
        syscall(SYS_futex, (unsigned *)&b->wake, FUTEX_WAIT_PRIVATE, w, NULL, NULL, 0);
    }
}

static inline int st_spin_barrier_aborted(const st_spin_barrier *b)
{
    return atomic_load_explicit(&b->aborted, memory_order_acquire);
}

/* Returns 0 once all n participants have arrived, -1 if the barrier was
 * aborted before (or while) waiting. */
static inline int st_spin_barrier_wait(st_spin_barrier *b)
{
    if (st_spin_barrier_aborted(b))
        return -1;
    unsigned gen = atomic_load_explicit(&b->generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1u, memory_order_acq_rel) + 1u == b->n) {
        atomic_store_explicit(&b->arrived, 0u, memory_order_relaxed);
        ST_BARRIER_RELEASE_HOOK();
        atomic_store_explicit(&b->generation, gen + 1u, memory_order_release);
        if (b->blocking)
            st_barrier_wake(b);
        return 0;
    }
    if (b->blocking)
        return st_barrier_sleep(b, gen);
    unsigned spins = 0;
    while (atomic_load_explicit(&b->generation, memory_order_acquire) == gen) {
        if (atomic_load_explicit(&b->aborted, memory_order_relaxed))
            return -1;
        if (spins < ST_BARRIER_SPINS) {
            spins++;
            st_cpu_relax();
        } else {
            sched_yield();
        }
    }
    return 0;
}

#endif /* SUBTRAIN_COMM_BARRIER_H */
