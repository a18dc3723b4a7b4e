/*
 * comm/mpi_plan.c — the MPI backend's planning (comm/mpi_engine.h): what
 * every rank holds, all-gathered as profiles of segments of constant local
 * holders split at the shard boundaries; from them, computed alike by
 * every rank, the regions each rank sends to and receives from each peer;
 * the exchange's buffers; and the regions the step reads and writes in
 * place.  Attach only (it may allocate); worker 0 runs it.
 */
#ifdef HAVE_MPI

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_engine.h"
#include "comm/sizing_world.h"
#include "core/error.h"
#include "core/ranges.h"

void *st_mpi_list_push(list *l)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        void *v = realloc(l->v, cap * l->size);
        if (!v)
            return NULL;
        l->v = v;
        l->cap = cap;
    }
    return (char *)l->v + l->size * l->n++;
}

st_status st_mpi_no_memory(void)
{
    return st_fail(ST_ERR_NOMEM, "out of memory planning the MPI reduction");
}

int st_mpi_rank_of_element(const mpi_comm *mc, uint64_t x)
{
    /* the rank shard of rank r is [shard_begin[f[r]], shard_begin[f[r + 1]]) */
    int lo = 0, hi = mc->size - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (mc->shard_begin[mc->first[mid]] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The local profile: the elements the rank's workers hold, cut wherever
 * any worker's held range starts or ends and at every shard boundary, with
 * the number of local holders of each piece.  Each piece thus has one set
 * of local holders (the pack items name them) and lies in one shard. */
static st_status local_profile(const mpi_comm *mc, list *out)
{
    list cuts = { NULL, 0, 0, sizeof(uint64_t) };
    st_status s = ST_OK;
    for (int w = 0; w < mc->n && s == ST_OK; w++)
        for (int i = 0; i < mc->workers[w].n_held && s == ST_OK; i++) {
            uint64_t *a = st_mpi_list_push(&cuts);
            uint64_t *b = a ? st_mpi_list_push(&cuts) : NULL;
            if (!b) {
                s = st_mpi_no_memory();
                break;
            }
            b[-1] = mc->workers[w].held[i].begin;   /* a may have moved */
            b[0] = mc->workers[w].held[i].end;
        }
    for (int g = 0; g <= mc->N && s == ST_OK; g++) {
        uint64_t *c = st_mpi_list_push(&cuts);
        if (!c)
            s = st_mpi_no_memory();
        else
            *c = mc->shard_begin[g];
    }
    int *cur = s == ST_OK ? calloc((size_t)mc->n, sizeof *cur) : NULL;
    if (s == ST_OK && !cur)
        s = st_mpi_no_memory();
    uint64_t *c = cuts.v;
    if (s == ST_OK)
        qsort(c, cuts.n, sizeof *c, cmp_u64);
    for (size_t k = 0; k + 1 < cuts.n && s == ST_OK; k++) {
        uint64_t a = c[k], b = c[k + 1];
        if (a == b || a >= mc->P)
            continue;
        uint64_t count = 0;
        for (int w = 0; w < mc->n; w++) {
            const mpi_worker *v = &mc->workers[w];
            while (cur[w] < v->n_held && v->held[cur[w]].end <= a)
                cur[w]++;
            if (cur[w] < v->n_held && v->held[cur[w]].begin <= a)
                count++;
        }
        if (!count)
            continue;
        prof_seg *p = st_mpi_list_push(out);
        if (!p)
            s = st_mpi_no_memory();
        else
            *p = (prof_seg){ a, b, count, 0 };
    }
    free(cur);
    free(cuts.v);
    return s;
}

/* The first copy that ends after x. */
static int copy_at(const mpi_comm *mc, uint64_t x)
{
    int lo = 0, hi = mc->n_copies;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (mc->copies[mid].offset + mc->copies[mid].count <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

uint64_t st_mpi_copy_run(const mpi_comm *mc, uint64_t x, uint64_t end, int *copy)
{
    *copy = -1;
    const int c = mc->copies_master ? copy_at(mc, x) : mc->n_copies;
    if (c == mc->n_copies)
        return end;
    const st_param_copy *cp = &mc->copies[c];
    if (cp->offset > x)
        return cp->offset < end ? cp->offset : end;
    *copy = c;
    return cp->offset + cp->count < end ? cp->offset + cp->count : end;
}

uint64_t st_mpi_copied_in(const mpi_comm *mc, uint64_t a, uint64_t b)
{
    uint64_t n = 0;
    for (int c = mc->copies_master ? copy_at(mc, a) : mc->n_copies;
         c < mc->n_copies && mc->copies[c].offset < b; c++) {
        const uint64_t lo = mc->copies[c].offset, hi = lo + mc->copies[c].count;
        n += (hi < b ? hi : b) - (lo > a ? lo : a);
    }
    return n;
}

/* copies_master: every worker of every rank lists the same copies (the
 * all-gather's layout and its items index them alike) over a vector in
 * the full layout; worker 0's list becomes the engine's. */
static st_status check_copies(mpi_comm *mc)
{
    const mpi_worker *w0 = &mc->workers[0];
    for (int w = 0; w < mc->n; w++) {
        const mpi_worker *v = &mc->workers[w];
        int same = v->n_copies == w0->n_copies;
        for (int c = 0; same && c < v->n_copies; c++)
            same = v->copies[c].offset == w0->copies[c].offset &&
                   v->copies[c].count == w0->copies[c].count;
        if (!same)
            return st_fail(ST_ERR_INVALID, "workers 0 and %d list different bf16 copies: they "
                           "cannot hold a bf16 master", w);
        for (int i = 0; i < v->n_held; i++)
            if (v->local[i] != v->held[i].begin)
                return st_fail(ST_ERR_INVALID, "worker %d: a bf16 master in the copies needs "
                               "the full layout", w);
    }
    mc->copies = w0->copies;
    mc->n_copies = w0->n_copies;
    if (mc->world)   /* a described job's ranks run one model */
        return ST_OK;
    uint64_t mine[2] = { (uint64_t)mc->n_copies, 14695981039346656037ull };
    for (int c = 0; c < mc->n_copies; c++)   /* FNV-1a over offsets and counts */
        mine[1] = ((mine[1] ^ mc->copies[c].offset) * 1099511628211ull ^ mc->copies[c].count) *
                  1099511628211ull;
    uint64_t *all = malloc(sizeof mine * (size_t)mc->size);
    if (!all)
        return st_mpi_no_memory();
    int rc = MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, mc->comm);
    st_status s = rc == MPI_SUCCESS ? ST_OK : st_world_fail(rc, "gathering the ranks' copies");
    for (int r = 0; r < mc->size && s == ST_OK; r++)
        if (all[2 * r] != mine[0] || all[2 * r + 1] != mine[1])
            s = st_fail(ST_ERR_INVALID, "ranks %d and %d list different bf16 copies: they "
                        "cannot hold a bf16 master", r, mc->rank);
    free(all);
    return s;
}

/* The end of the allowed-unheld range containing pos, or pos if none. */
static uint64_t unheld_allowed_until(const mpi_comm *mc, uint64_t pos)
{
    if (!mc->allow_unheld)
        return pos;
    if (!mc->unheld)
        return mc->P;
    for (int i = 0; i < mc->n_unheld; i++)
        if (mc->unheld[i].begin <= pos && pos < mc->unheld[i].end)
            return mc->unheld[i].end;
    return pos;
}

/* Every element has a holder on some rank (or may be unheld).  Every rank
 * checks the whole vector, so they all fail alike. */
static st_status check_coverage(const mpi_comm *mc)
{
    size_t *cur = calloc((size_t)mc->size, sizeof *cur);
    if (!cur)
        return st_mpi_no_memory();
    st_status s = ST_OK;
    uint64_t pos = 0;
    while (pos < mc->P && s == ST_OK) {
        uint64_t next = mc->P;
        int held = 0;
        for (int r = 0; r < mc->size; r++) {
            const prof_seg *p = mc->prof[r];
            while (cur[r] < mc->n_prof[r] && p[cur[r]].end <= pos)
                cur[r]++;
            if (cur[r] == mc->n_prof[r])
                continue;
            if (p[cur[r]].begin <= pos) {
                held = 1;
                next = p[cur[r]].end < next ? p[cur[r]].end : next;
            } else if (p[cur[r]].begin < next) {
                next = p[cur[r]].begin;
            }
        }
        if (!held) {
            uint64_t allowed = unheld_allowed_until(mc, pos);
            if (allowed == pos) {
                s = st_fail(ST_ERR_INVALID, "element %llu of the %zu-element vector is held by "
                            "no worker of any rank (every element needs at least one holder%s)",
                            (unsigned long long)pos, mc->P, mc->allow_unheld ? " outside the "
                            "ranges allowed to be unheld" : "");
                break;
            }
            next = allowed < next ? allowed : next;
        }
        pos = next;
    }
    free(cur);
    return s;
}

/* Local worker v's address of element x in its gradient (or parameter)
 * vector, v being x's one local holder; NULL if no local worker holds x. */
float *st_mpi_sole_holder_at(const mpi_comm *mc, uint64_t x, int params, int *who)
{
    for (int v = 0; v < mc->n; v++) {
        const mpi_worker *wv = &mc->workers[v];
        const int lo = st_ranges_after(wv->held, wv->n_held, (size_t)x);
        if (lo < wv->n_held && wv->held[lo].begin <= x) {
            *who = v;
            return (params ? wv->params : wv->grads) + wv->local[lo] + (x - wv->held[lo].begin);
        }
    }
    return NULL;
}

/* This rank's region for rank d (its profile's segments in d's rank
 * shard) as one run of a single local worker's vector: its start, or NULL
 * if it is not one (several holders, several workers, a gap). */
static float *direct_region(const mpi_comm *mc, int d, int params)
{
    const prof_seg *p = mc->prof[mc->rank];
    float *start = NULL, *expect = NULL;
    int holder = -1;
    for (size_t j = 0; j < mc->n_prof[mc->rank]; j++) {
        if (st_mpi_rank_of_element(mc, p[j].begin) != d)
            continue;
        int v = -1;
        float *a = p[j].count == 1 ? st_mpi_sole_holder_at(mc, p[j].begin, params, &v) : NULL;
        if (!a || (start && (v != holder || a != expect)))
            return NULL;
        if (!start) {
            start = a;
            holder = v;
        }
        expect = a + (p[j].end - p[j].begin);
    }
    return start;
}

/* Rank s's region of this rank shard as one run of one local owner's
 * master: its start, or NULL. */
static const float *direct_masters(const mpi_comm *mc, int s)
{
    const prof_seg *p = mc->prof[s];
    uint64_t begin = 0, end = 0;
    int any = 0;
    for (size_t j = 0; j < mc->n_prof[s]; j++) {
        if (st_mpi_rank_of_element(mc, p[j].begin) != mc->rank)
            continue;
        if (any && p[j].begin != end)
            return NULL;
        if (!any)
            begin = p[j].begin;
        any = 1;
        end = p[j].end;
    }
    if (!any)
        return NULL;
    int g = mc->first[mc->rank];
    while (mc->shard_begin[g + 1] <= begin)
        g++;
    if (end > mc->shard_begin[g + 1])
        return NULL;
    return mc->workers[g - mc->first[mc->rank]].master + (begin - mc->shard_begin[g]);
}

/* Worker 0, after the layout: where the step's exchange can read and
 * write in place (the pack, the all-gather's copies and the masters'
 * copy-out then skip those regions); else the packed buffers. */
static void find_direct(mpi_comm *mc)
{
    for (int r = 0; r < mc->size; r++) {
        /* bf16: every partial is converted on its way out, none sent in place */
        float *a = r == mc->rank || mc->bf16 ? NULL : direct_region(mc, r, 0);
        mc->rs_direct[r] = a != NULL && (mc->roles & ST_COMM_REDUCE);
        mc->rs_out[r] = mc->rs_direct[r] ? a : mc->send + mc->send_off[r];
        /* a bf16 master's region is packed: its fp32 part, then its bf16 */
        const int gather = (mc->roles & ST_COMM_GATHER) && !mc->copies_master;
        const float *m = r == mc->rank || !gather ? NULL : direct_masters(mc, r);
        mc->ag_src_direct[r] = m != NULL;
        mc->ag_src[r] = m ? m : mc->recv + mc->recv_off[r];
        float *b = r == mc->rank || !gather ? NULL : direct_region(mc, r, 1);
        mc->ag_dst_direct[r] = b != NULL;
        mc->ag_dst[r] = b ? b : mc->send + mc->send_off[r];
    }
}

/* Worker 0, between the barriers of attach: every rank's profile, the
 * layout of the exchange and its buffers.  Every rank computes the same
 * layout from the same profiles. */
st_status st_mpi_plan_exchange(mpi_comm *mc, st_arena *arena)
{
    const int R = mc->size, me = mc->rank;
    list mine = { NULL, 0, 0, sizeof(prof_seg) };
    st_status s = mc->copies_master ? check_copies(mc) : ST_OK;
    if (s == ST_OK)
        s = local_profile(mc, &mine);
    unsigned long long my_n = mine.n, *all_n = NULL;
    int *counts = NULL, *displs = NULL;
    uint64_t *all = NULL;
    if (s == ST_OK) {
        all_n = malloc(sizeof *all_n * (size_t)R);
        counts = malloc(sizeof *counts * 2 * (size_t)R);
        if (!all_n || !counts)
            s = st_mpi_no_memory();
    }
    size_t *got = s == ST_OK && mc->world ? malloc(sizeof *got * (size_t)R) : NULL;
    if (s == ST_OK && mc->world && !got)
        s = st_mpi_no_memory();
    if (s == ST_OK && mc->world) {   /* a described job's ranks, in this process */
        void *p = NULL;
        s = st_comm_world_allgatherv(mc->world, me, mine.v, mine.n * sizeof(prof_seg), &p, got);
        all = p;
        for (int r = 0; r < R && s == ST_OK; r++)
            all_n[r] = got[r] / sizeof(prof_seg);
    }
    free(got);
    if (s == ST_OK && !mc->world) {
        int rc = MPI_Allgather(&my_n, 1, MPI_UNSIGNED_LONG_LONG, all_n, 1,
                               MPI_UNSIGNED_LONG_LONG, mc->comm);
        if (rc != MPI_SUCCESS)
            s = st_world_fail(rc, "gathering the ranks' holdings");
    }
    size_t total = 0;
    for (int r = 0; r < R && s == ST_OK; r++) {
        if (4 * (total + all_n[r]) > (size_t)INT_MAX)
            s = st_fail(ST_ERR_INVALID, "the ranks' holdings have too many pieces to exchange");
        total += all_n[r];
    }
    if (s == ST_OK && !mc->world) {
        displs = counts + R;
        for (int r = 0, at = 0; r < R; r++) {
            counts[r] = (int)(4 * all_n[r]);
            displs[r] = at;
            at += counts[r];
        }
        all = malloc(sizeof *all * 4 * (total ? total : 1));
        if (!all)
            s = st_mpi_no_memory();
    }
    if (s == ST_OK && !mc->world) {
        int rc = MPI_Allgatherv(mine.v ? mine.v : (void *)all, (int)(4 * my_n), MPI_UINT64_T, all,
                                counts, displs, MPI_UINT64_T, mc->comm);
        if (rc != MPI_SUCCESS)
            s = st_world_fail(rc, "gathering the ranks' holdings");
    }
    /* each rank's profile, with the offset of each segment in its region
     * for the rank that owns it (a running count per destination) */
    size_t *run = s == ST_OK ? calloc(2 * (size_t)R, sizeof *run) : NULL;
    size_t *run_f = run ? run + R : NULL;   /* the fp32 elements' (copies_master) */
    if (s == ST_OK && !run)
        s = st_mpi_no_memory();
    for (int r = 0, at = 0; r < R && s == ST_OK; r++) {
        size_t n = all_n[r];
        mc->prof[r] = malloc(sizeof(prof_seg) * (n ? n : 1));
        if (!mc->prof[r]) {
            s = st_mpi_no_memory();
            break;
        }
        memcpy(mc->prof[r], all + at, sizeof(prof_seg) * n);
        mc->n_prof[r] = n;
        at += (int)(4 * n);
        if (mc->copies_master && !(mc->f_off[r] = malloc(sizeof(size_t) * (n ? n : 1)))) {
            s = st_mpi_no_memory();
            break;
        }
        memset(run, 0, sizeof *run * 2 * (size_t)R);
        for (size_t j = 0; j < n; j++) {
            prof_seg *p = &mc->prof[r][j];
            int d = st_mpi_rank_of_element(mc, p->begin);
            p->off = run[d];
            run[d] += p->end - p->begin;
            if (mc->copies_master) {
                mc->f_off[r][j] = run_f[d];
                run_f[d] += p->end - p->begin - st_mpi_copied_in(mc, p->begin, p->end);
            }
        }
        if (r == me)
            for (int d = 0; d < R; d++) {
                mc->send_len[d] = d == me ? 0 : run[d];
                mc->send_f[d] = d == me ? 0 : run_f[d];
            }
        mc->recv_len[r] = run[me];
        mc->recv_f[r] = run_f[me];
    }
    if (s == ST_OK)
        s = check_coverage(mc);
    size_t n_send = 0, n_recv = 0;
    /* a bf16 master's all-gather counts its messages in 2-byte units */
    const size_t unit = mc->copies_master ? 2 : 1;
    for (int r = 0; r < R && s == ST_OK; r++) {
        mc->send_off[r] = n_send;
        mc->recv_off[r] = n_recv;
        if (unit * mc->send_len[r] > (size_t)INT_MAX ||
            unit * mc->recv_len[r] > (size_t)INT_MAX ||
            n_send + mc->send_len[r] > (size_t)INT_MAX ||
            n_recv + mc->recv_len[r] > (size_t)INT_MAX)
            s = st_fail(ST_ERR_INVALID, "more than %d floats to exchange with one rank: use more "
                        "ranks or a smaller model", INT_MAX);
        n_send += mc->send_len[r];
        n_recv += mc->recv_len[r];
    }
    if (s == ST_OK && n_send)
        s = st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, n_send, &mc->send);
    if (s == ST_OK && n_recv)
        s = st_arena_alloc_floats(arena, ST_MEM_WORKSPACE, n_recv, &mc->recv);
    void *p16;
    if (s == ST_OK && mc->bf16 && n_send &&
        (s = st_arena_alloc(arena, ST_MEM_WORKSPACE, n_send * sizeof(uint16_t), &p16)) == ST_OK)
        mc->send16 = p16;
    if (s == ST_OK && mc->bf16 && n_recv &&
        (s = st_arena_alloc(arena, ST_MEM_WORKSPACE, n_recv * sizeof(uint16_t), &p16)) == ST_OK)
        mc->recv16 = p16;
    if (s == ST_OK)
        find_direct(mc);
    if (s == ST_OK) {
        size_t in = 0;
        const size_t rs_size = mc->bf16 ? sizeof(uint16_t) : sizeof(float);
        for (int r = 0; r < R; r++)
            if (r != me)
                in += (mc->roles & ST_COMM_REDUCE ? mc->recv_len[r] * rs_size : 0) +
                      (!(mc->roles & ST_COMM_GATHER) ? 0
                       : !mc->copies_master ? mc->send_len[r] * sizeof(float)
                       : mc->send_f[r] * sizeof(float) +
                             (mc->send_len[r] - mc->send_f[r]) * sizeof(uint16_t));
        mc->mpi_bytes = in;
    }
    free(run);
    free(all);
    free(counts);
    free(all_n);
    free(mine.v);
    return s;
}

#endif /* HAVE_MPI */
