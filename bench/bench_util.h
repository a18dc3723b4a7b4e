/*
 * bench/bench_util.h — what the benchmark programs share: a monotonic
 * clock (or the thread's CPU time), sorting doubles for medians, and
 * "--name VALUE" / "--name=VALUE" option parsing with one-line usage
 * errors.  Header-only, every function
 * static inline (a program of several files includes it in each); define
 * BENCH_NAME (the program's name) before including it.
 */
#ifndef SUBTRAIN_BENCH_UTIL_H
#define SUBTRAIN_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_USAGE 2

/* BENCH_CLOCK=thread in the environment: the calling thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID), the time it ran and not the time it waited
 * for a core, for a machine whose cores other programs share; a timed
 * part must then run on the calling thread (one thread: bench_step).
 * Otherwise wall-clock time. */
static inline clockid_t bench_clock(void)
{
    static int which = -1;
    if (which < 0) {
        const char *v = getenv("BENCH_CLOCK");
        which = v && strcmp(v, "thread") == 0;
    }
    return which ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
}

static inline double now_s(void)
{
    struct timespec t;
    clock_gettime(bench_clock(), &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One line on stderr, "BENCH_NAME: <fmt with arg> (try --help)"; exit 2. */
static inline int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, BENCH_NAME ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (try --help)\n");
    return EXIT_USAGE;
}

/* "--name VALUE" or "--name=VALUE": the value, or NULL if argv[*i] is not
 * --name (then *missing says whether it was --name without a value). */
static inline const char *option_value(int argc, char **argv, int *i, const char *name,
                                       int *missing)
{
    const char *arg = argv[*i];
    size_t len = strlen(name);
    if (strncmp(arg, name, len) != 0)
        return NULL;
    if (arg[len] == '=')
        return arg + len + 1;
    if (arg[len] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

#endif /* SUBTRAIN_BENCH_UTIL_H */
