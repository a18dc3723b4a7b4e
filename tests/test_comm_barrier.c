/*
 * tests/test_comm_barrier.c — the spin barrier of the reduction engine
 * (comm/barrier.h) under stress, in a copy of it that yields between the
 * last arriver's two stores.
 */
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

/* ------------------------------------------------------------ the spin barrier */

/* The barrier itself (comm/barrier.h), under stress: many rounds with
 * nothing between them and more threads than cores.  The order of the
 * last arriver's two stores matters: bumping the generation before
 * clearing the counter lets a woken waiter arrive for the next round
 * before the clear, which then erases that arrival, and the round never
 * completes.  Plain stress hits that window rarely (measured: a 2-thread
 * loop deadlocked after 20,000 to 70,000 rounds, seconds on a quiet
 * machine), so this copy of the barrier yields the CPU between the two
 * stores (ST_BARRIER_RELEASE_HOOK): with more threads than cores a woken
 * waiter runs right then, and a wrong order hangs within a few rounds.
 * Waiters yield after a few spins (ST_BARRIER_SPINS), so that the rounds
 * of an oversubscribed machine stay fast.  A watchdog turns a hang into a
 * failure: it aborts the barrier, which lets every waiter out.  Each
 * thread also checks, after each round, that every thread arrived in it
 * and none is more than one round ahead. */
#define ST_BARRIER_SPINS 64
#define ST_BARRIER_RELEASE_HOOK() sched_yield()
#include "comm/barrier.h"

#define STRESS_ROUNDS 20000
#define STRESS_STALL_S 5.0     /* no round completed for this long: a hang */

typedef struct stress {
    st_spin_barrier barrier;
    int threads;
    alignas(64) atomic_long arrivals;   /* every thread adds 1 before each wait */
    alignas(64) atomic_long done;       /* rounds thread 0 has passed */
    atomic_long early, late;            /* rounds some thread saw wrong counts in */
    atomic_int aborted;
} stress;

typedef struct stress_arg {
    stress *s;
    int id;
} stress_arg;

static void *stress_thread(void *p)
{
    stress_arg *a = p;
    stress *s = a->s;
    const long T = s->threads;
    for (long r = 0; r < STRESS_ROUNDS; r++) {
        atomic_fetch_add(&s->arrivals, 1);
        if (st_spin_barrier_wait(&s->barrier) != 0) {
            atomic_store(&s->aborted, 1);
            return NULL;
        }
        /* past round r: all T arrived r + 1 times; the others may have
         * arrived for round r + 1 already, not later (they wait for me) */
        long seen = atomic_load(&s->arrivals);
        if (seen < (r + 1) * T)
            atomic_fetch_add(&s->early, 1);
        if (seen > (r + 2) * T - 1)
            atomic_fetch_add(&s->late, 1);
        if (a->id == 0)
            atomic_store(&s->done, r + 1);
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void many_rounds(int blocking)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int T = (int)(cpus < 2 ? 3 : cpus + 1);   /* more threads than cores */
    T = T > 64 ? 64 : T;
    stress *s = aligned_alloc(64, sizeof *s);
    cr_assert_not_null(s);
    memset(s, 0, sizeof *s);
    st_spin_barrier_init(&s->barrier, (unsigned)T, blocking);
    s->threads = T;
    pthread_t tid[64];
    stress_arg args[64];
    for (int i = 0; i < T; i++) {
        args[i] = (stress_arg){ s, i };
        cr_assert_eq(pthread_create(&tid[i], NULL, stress_thread, &args[i]), 0);
    }
    /* the watchdog: progress is thread 0's rounds */
    long last = -1;
    double since = now_s();
    int hung = 0;
    while (atomic_load(&s->done) < STRESS_ROUNDS && !atomic_load(&s->aborted)) {
        struct timespec nap = { 0, 10 * 1000 * 1000 };
        nanosleep(&nap, NULL);
        long d = atomic_load(&s->done);
        if (d != last) {
            last = d;
            since = now_s();
        } else if (now_s() - since > STRESS_STALL_S) {
            hung = 1;
            st_spin_barrier_abort(&s->barrier);
            break;
        }
    }
    for (int i = 0; i < T; i++)
        pthread_join(tid[i], NULL);
    long done = atomic_load(&s->done), arrivals = atomic_load(&s->arrivals);
    cr_log_info("%s barrier: %d threads on %ld CPUs, %ld of %d rounds",
                blocking ? "blocking" : "spin", T, cpus, done, STRESS_ROUNDS);
    cr_assert(!hung, "%d threads hung in round %ld of %d (%ld arrivals counted, the barrier "
              "waits for more): an arrival was lost", T, done + 1, STRESS_ROUNDS, arrivals);
    cr_assert_eq(done, STRESS_ROUNDS);
    cr_assert_eq(arrivals, (long)STRESS_ROUNDS * T);
    cr_assert_eq(atomic_load(&s->early), 0, "a thread left a round before every thread arrived");
    cr_assert_eq(atomic_load(&s->late), 0, "a thread ran more than a round ahead");
    free(s);
}

Test(spin_barrier, many_rounds_more_threads_than_cores_lose_no_arrival, .timeout = 120)
{
    many_rounds(0);
}

/* The sizing run's engines: waiters sleep, the last arriver wakes them. */
Test(spin_barrier, blocking_many_rounds_lose_no_arrival, .timeout = 120)
{
    many_rounds(1);
}

/* An abort lets out every waiter of a blocking barrier, which sleep with
 * no timeout: threads wait for one that never arrives, the abort comes
 * once they sleep, and each returns -1 (a waiter missing the wake-up
 * sleeps on, and the test's time limit fails it). */
#define ABORT_WAITERS 8

static void *abort_waiter(void *p)
{
    st_spin_barrier *b = p;
    return (void *)(long)st_spin_barrier_wait(b);
}

Test(spin_barrier, blocking_waiters_leave_on_an_abort, .timeout = 20)
{
    st_spin_barrier *b = aligned_alloc(64, sizeof *b);
    cr_assert_not_null(b);
    st_spin_barrier_init(b, ABORT_WAITERS + 1, 1);
    pthread_t tid[ABORT_WAITERS];
    for (int i = 0; i < ABORT_WAITERS; i++)
        cr_assert_eq(pthread_create(&tid[i], NULL, abort_waiter, b), 0);
    while (atomic_load(&b->arrived) < ABORT_WAITERS)
        sched_yield();
    const struct timespec settle = { 0, 50 * 1000 * 1000 };   /* into their sleep */
    nanosleep(&settle, NULL);
    st_spin_barrier_abort(b);
    for (int i = 0; i < ABORT_WAITERS; i++) {
        void *rc;
        pthread_join(tid[i], &rc);
        cr_expect_eq((long)rc, -1, "waiter %d left with %ld", i, (long)rc);
    }
    free(b);
}
