/*
 * core/ranges.h — lookups in a sorted list of disjoint parameter ranges
 * (what a worker holds, where a bf16 master lives).
 */
#ifndef ST_CORE_RANGES_H
#define ST_CORE_RANGES_H

#include <subtrain/params.h>

/* The first of r[0..n) (sorted, disjoint) that ends after x; n if none. */
static inline int st_ranges_after(const st_range *r, int n, size_t x)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (r[mid].end <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The piece of [at, end) from at on that lies all inside one of r[0..n)
 * or outside all of them: its end, and *inside which. */
static inline size_t st_ranges_piece(const st_range *r, int n, size_t at, size_t end,
                                     int *inside)
{
    const int i = st_ranges_after(r, n, at);
    *inside = i < n && r[i].begin <= at;
    const size_t to = i == n ? end : *inside ? r[i].end : r[i].begin;
    return to < end ? to : end;
}

#endif /* ST_CORE_RANGES_H */
