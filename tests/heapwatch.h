/*
 * tests/heapwatch.h — interposes the C library's malloc, calloc and
 * realloc, and oneDNN's dnnl_primitive_execute, for the whole test program
 * (libsubtrain and oneDNN included), so that a test can count the heap
 * calls subtrain itself makes during training steps.
 *
 * oneDNN 2.6 allocates inside every dnnl_primitive_execute(): the C API
 * turns the argument array into a std::unordered_map per call.  That is
 * outside subtrain's control, so calls made while oneDNN executes are told
 * apart (per thread).
 *
 * The including file decides what to count, by defining before the
 * include (per thread, or summed over threads):
 *   static void heapwatch_heap_call(int inside_onednn);  every heap call
 *   static void heapwatch_execute(void);                 every execution
 * or, for the common case, by defining HEAPWATCH_PER_THREAD: this thread's
 * counts while its `armed` flag is set (own_calls, dnnl_calls, executes);
 * and includes this header once, after <oneapi/dnnl/dnnl.h> (or
 * "nn/dnnl_util.h") and with _GNU_SOURCE defined (for RTLD_NEXT).
 */
#ifndef SUBTRAIN_TESTS_HEAPWATCH_H
#define SUBTRAIN_TESTS_HEAPWATCH_H

/* AddressSanitizer owns malloc, and a program that interposes it too
 * aborts in the sanitizer's start-up: under it (./configure
 * --enable-sanitizers) nothing is interposed and the tests that count
 * heap calls skip themselves (HEAPWATCH_SKIP_IF_OFF), so that every other
 * assertion of their suites runs sanitized.  The plain build runs them. */
#if defined(__SANITIZE_ADDRESS__)
#define HEAPWATCH_ACTIVE 0
#else
#define HEAPWATCH_ACTIVE 1
#endif
#define HEAPWATCH_SKIP_IF_OFF()                                                        \
    do {                                                                               \
        if (!HEAPWATCH_ACTIVE)                                                         \
            cr_skip_test("heap calls are not counted under AddressSanitizer");         \
    } while (0)

#ifdef HEAPWATCH_PER_THREAD
static _Thread_local int armed;
static _Thread_local long own_calls, dnnl_calls, executes;

static void heapwatch_heap_call(int inside_onednn)
{
    if (armed) {
        if (inside_onednn)
            dnnl_calls++;
        else
            own_calls++;
    }
}

static void heapwatch_execute(void)
{
    executes += armed;
}
#endif

#include <dlfcn.h>
#include <stddef.h>

static _Thread_local int heapwatch_in_dnnl;

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

#if HEAPWATCH_ACTIVE
void *malloc(size_t n)
{
    heapwatch_heap_call(heapwatch_in_dnnl);
    return __libc_malloc(n);
}

void *calloc(size_t k, size_t n)
{
    heapwatch_heap_call(heapwatch_in_dnnl);
    return __libc_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
    heapwatch_heap_call(heapwatch_in_dnnl);
    return __libc_realloc(p, n);
}
#endif /* HEAPWATCH_ACTIVE */

typedef dnnl_status_t (*heapwatch_execute_fn)(const_dnnl_primitive_t, dnnl_stream_t, int,
                                              const dnnl_exec_arg_t *);

dnnl_status_t dnnl_primitive_execute(const_dnnl_primitive_t p, dnnl_stream_t s, int nargs,
                                     const dnnl_exec_arg_t *args)
{
    static heapwatch_execute_fn real;
    if (!real) {
        heapwatch_in_dnnl++; /* dlsym may allocate */
        *(void **)&real = dlsym(RTLD_NEXT, "dnnl_primitive_execute");
        heapwatch_in_dnnl--;
    }
    heapwatch_execute();
    heapwatch_in_dnnl++;
    dnnl_status_t r = real(p, s, nargs, args);
    heapwatch_in_dnnl--;
    return r;
}

#endif /* SUBTRAIN_TESTS_HEAPWATCH_H */
