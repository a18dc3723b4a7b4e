/*
 * comm/sizing_world.c — a described job's ranks in one process, for a
 * sizing run (comm/sizing_world.h): the gathers of the MPI backend's
 * attach between the ranks' local workers 0, over a blocking barrier
 * (a sizing run's threads outnumber the cores).
 */
#include <stdlib.h>
#include <string.h>

#include "comm/barrier.h"
#include "comm/sizing_world.h"
#include "core/error.h"

struct st_comm_world {
    st_spin_barrier barrier;   /* the ranks' gathering threads */
    int size;
    const void **mine;         /* [rank]: what it gives to the gather under way */
    size_t *bytes;
};

st_status st_comm_world_create(int ranks, st_comm_world **out)
{
    *out = NULL;
    if (ranks < 1)
        return st_fail(ST_ERR_INVALID, "a described job of %d ranks", ranks);
    st_comm_world *w = aligned_alloc(64, sizeof *w);
    if (!w)
        return st_fail(ST_ERR_NOMEM, "out of memory for %d described ranks", ranks);
    memset(w, 0, sizeof *w);
    w->size = ranks;
    w->mine = calloc((size_t)ranks, sizeof *w->mine);
    w->bytes = calloc((size_t)ranks, sizeof *w->bytes);
    if (!w->mine || !w->bytes) {
        st_comm_world_destroy(w);
        return st_fail(ST_ERR_NOMEM, "out of memory for %d described ranks", ranks);
    }
    st_spin_barrier_init(&w->barrier, (unsigned)ranks, 1);
    *out = w;
    return ST_OK;
}

void st_comm_world_destroy(st_comm_world *w)
{
    if (!w)
        return;
    free(w->mine);
    free(w->bytes);
    free(w);
}

int st_comm_world_size(const st_comm_world *w)
{
    return w->size;
}

void st_comm_world_abort(st_comm_world *w)
{
    if (w)
        st_spin_barrier_abort(&w->barrier);
}

st_status st_comm_world_barrier(st_comm_world *w)
{
    if (st_spin_barrier_wait(&w->barrier))
        return st_fail(ST_ERR_INVALID, "another rank failed");
    return ST_OK;
}

st_status st_comm_world_allgatherv(st_comm_world *w, int rank, const void *mine, size_t bytes,
                                   void **all, size_t *counts)
{
    *all = NULL;
    w->mine[rank] = mine;
    w->bytes[rank] = bytes;
    /* every rank's contribution is there */
    if (st_spin_barrier_wait(&w->barrier))
        return st_fail(ST_ERR_INVALID, "another rank failed");
    size_t total = 0;
    for (int r = 0; r < w->size; r++)
        total += counts[r] = w->bytes[r];
    char *p = malloc(total ? total : 1);
    size_t at = 0;
    for (int r = 0; p && r < w->size; at += w->bytes[r], r++)
        if (w->bytes[r])
            memcpy(p + at, w->mine[r], w->bytes[r]);
    /* every rank has read every contribution: they may go */
    if (st_spin_barrier_wait(&w->barrier)) {
        free(p);
        return st_fail(ST_ERR_INVALID, "another rank failed");
    }
    if (!p)
        return st_fail(ST_ERR_NOMEM, "out of memory gathering the described ranks' holdings");
    *all = p;
    return ST_OK;
}
