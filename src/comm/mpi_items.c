/*
 * comm/mpi_items.c — the MPI backend's work items (comm/mpi_engine.h): from
 * the exchange's layout (mpi_plan.c), each worker's share of the step as
 * rs and ag items (comm/kernels.h) in its arena — the pack of the rank's
 * partials, the owner's sums, the all-gather's copies out of the masters
 * and into the replicas — and what they read and write per step.  Attach
 * only (it may allocate).
 */
#ifdef HAVE_MPI

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_engine.h"
#include "core/blocked.h"
#include "core/error.h"

/* l's elements copied into the arena (*out NULL for an empty list). */
static st_status list_to_arena(st_arena *arena, const list *l, void **out)
{
    *out = NULL;
    if (!l->n)
        return ST_OK;
    ST_TRY(st_arena_alloc(arena, ST_MEM_WORKSPACE, l->n * l->size, out));
    memcpy(*out, l->v, l->n * l->size);
    return ST_OK;
}

/* Where element x of local worker v's held ranges lives in `base` (its
 * gradient or parameter vector), or NULL if v does not hold x; cur: v's
 * cursor over its ranges, for non-decreasing x. */
static float *held_at(const mpi_worker *v, float *base, uint64_t x, int *cur)
{
    while (*cur < v->n_held && v->held[*cur].end <= x)
        (*cur)++;
    if (*cur < v->n_held && v->held[*cur].begin <= x)
        return base + v->local[*cur] + (x - v->held[*cur].begin);
    return NULL;
}

/* An rs item whose ops add srcs[0..k) in order into out (divided by
 * `count` at the end if divide); kinds[j]: srcs[j]'s SRC_* (NULL: all
 * fp32). */
static st_status push_sum(list *items, list *ops, float *out, size_t len, void *const *srcs,
                          const uint8_t *kinds, int k, int divide, float count)
{
    rs_item *it = st_mpi_list_push(items);
    if (!it)
        return st_mpi_no_memory();
    *it = (rs_item){ out, len, ops->n, 0, count };
    for (int j = 0; j < k; j++) {
        if (j == 1)
            continue;              /* folded into the OP_SUM2 of j = 0 */
        rs_op *op = st_mpi_list_push(ops);
        if (!op)
            return st_mpi_no_memory();
        const uint8_t ka = kinds ? kinds[j] : SRC_F32;
        const uint8_t kb = kinds && j == 0 && k > 1 ? kinds[1] : SRC_F32;
        if (j == 0)
            *op = (rs_op){ srcs[0], k > 1 ? srcs[1] : NULL, k > 1 ? OP_SUM2 : OP_COPY, 0,
                           (uint8_t)(divide && k <= 2), ka, kb };
        else
            *op = (rs_op){ srcs[j], NULL, OP_ACC, 0, (uint8_t)(divide && j == k - 1), ka,
                           SRC_F32 };
        ((rs_item *)items->v)[items->n - 1].n_ops++;
    }
    return ST_OK;
}

/* An rs item out[0..n) = src[0..n) over elements [x, x + n), less the
 * pieces inside a bf16 master's copies (copies_master: the initial masters
 * hold no value there). */
static st_status push_outside_copies(const mpi_comm *mc, list *items, list *ops, float *out,
                                     uint64_t x, size_t n, void *src, uint8_t kind, float count)
{
    for (uint64_t y = x; y < x + n;) {
        int c;
        const uint64_t e = st_mpi_copy_run(mc, y, x + n, &c);
        void *at = (float *)src + (y - x);
        if (c < 0)
            ST_TRY(push_sum(items, ops, out + (y - x), e - y, &at, &kind, 1, 0, count));
        y = e;
    }
    return ST_OK;
}

/* Worker w's share of the rank's partials: the local profile's segments
 * in exchange order, split evenly over the rank's workers by element
 * count.  first_only: the first local holder's value alone (the masters'
 * initial values, from params); else the sum of all local holders'
 * gradients. */
st_status st_mpi_build_pack(const mpi_comm *mc, int w, int first_only, list *items, list *ops)
{
    const int me = mc->rank;
    const prof_seg *p = mc->prof[me];
    size_t n = mc->n_prof[me], total = 0;
    for (size_t j = 0; j < n; j++)
        total += p[j].end - p[j].begin;
    /* worker w's part of the concatenation: [lo, hi) */
    size_t lo = total * (size_t)w / (size_t)mc->n, hi = total * (size_t)(w + 1) / (size_t)mc->n;
    int *cur = calloc((size_t)mc->n, sizeof *cur);
    void **srcs = calloc((size_t)mc->n, sizeof *srcs);
    uint8_t *kinds = calloc((size_t)mc->n, sizeof *kinds);
    st_status s = cur && srcs && kinds ? ST_OK : st_mpi_no_memory();
    /* bf16 payloads: each gradient rounded as it is read (not the
     * parameters of the masters' first exchange) */
    const uint8_t kind = mc->bf16 && !first_only ? SRC_F32_RNE : SRC_F32;
    size_t at = 0;
    for (size_t j = 0; j < n && s == ST_OK; j++) {
        size_t len = p[j].end - p[j].begin;
        size_t a = at > lo ? at : lo, b = at + len < hi ? at + len : hi;
        at += len;
        if (a >= b)
            continue;
        uint64_t x = p[j].begin + (a - (at - len));
        int d = st_mpi_rank_of_element(mc, x);
        /* the step sends a direct region as it is, and the owner reads a
         * lone local holder's value in place */
        if (!first_only && (d == me ? p[j].count == 1 : mc->rs_direct[d]))
            continue;
        float *out = d == me ? mc->recv + mc->recv_off[me] : mc->send + mc->send_off[d];
        out += p[j].off + (x - p[j].begin);
        int k = 0;
        for (int v = 0; v < mc->n; v++) {
            const mpi_worker *wv = &mc->workers[v];
            float *src = held_at(wv, first_only ? wv->params : wv->grads, x, &cur[v]);
            if (src && !(first_only && k)) {
                kinds[k] = kind;
                srcs[k++] = src;
            }
        }
        s = first_only ? push_outside_copies(mc, items, ops, out, x, b - a, srcs[0], kinds[0],
                                             1.0f)
                       : push_sum(items, ops, out, b - a, srcs, kinds, k, 0, 1.0f);
    }
    free(kinds);
    free(srcs);
    free(cur);
    return s;
}

/* Owner w's shard from the partials in `recv`: the ranks that hold each
 * piece, in rank order; the sum divided by the total holder count (mean),
 * or the first rank's value alone (first_only: the initial masters). */
st_status st_mpi_build_own(const mpi_comm *mc, int w, int first_only, float *out, list *items,
                           list *ops)
{
    const int R = mc->size, me = mc->rank, g = mc->first[me] + w;
    const uint64_t b0 = mc->shard_begin[g], b1 = mc->shard_begin[g + 1];
    size_t *cur = calloc((size_t)R, sizeof *cur);
    void **srcs = calloc((size_t)R, sizeof *srcs);
    uint8_t *kinds = calloc((size_t)R, sizeof *kinds);
    st_status s = cur && srcs && kinds ? ST_OK : st_mpi_no_memory();
    const int half = mc->bf16 && !first_only;   /* the step's sums of bf16 payloads */
    uint64_t pos = b0;
    while (pos < b1 && s == ST_OK) {
        uint64_t next = b1, count = 0;
        int k = 0;
        for (int r = 0; r < R; r++) {
            const prof_seg *p = mc->prof[r];
            while (cur[r] < mc->n_prof[r] && p[cur[r]].end <= pos)
                cur[r]++;
            if (cur[r] == mc->n_prof[r])
                continue;
            const prof_seg *q = &p[cur[r]];
            if (q->begin <= pos) {
                next = q->end < next ? q->end : next;
                count += q->count;
                int v;
                const size_t at = mc->recv_off[r] + q->off + (pos - q->begin);
                if (!first_only && r == me && q->count == 1) {
                    /* in place (pack skips it); bf16: rounded as read */
                    kinds[k] = half ? SRC_F32_RNE : SRC_F32;
                    srcs[k++] = st_mpi_sole_holder_at(mc, pos, 0, &v);
                } else if (half && r != me) {
                    kinds[k] = SRC_BF16;       /* another rank's bf16 partial */
                    srcs[k++] = mc->recv16 + at;
                } else {
                    kinds[k] = SRC_F32;        /* this rank's partial: stays fp32 */
                    srcs[k++] = mc->recv + at;
                }
            } else if (q->begin < next) {
                next = q->begin;
            }
        }
        if (k && first_only)
            s = push_outside_copies(mc, items, ops, out + (pos - b0), pos, next - pos, srcs[0],
                                    kinds[0], (float)count);
        else if (k)
            s = push_sum(items, ops, out + (pos - b0), next - pos, srcs, kinds, k, 1,
                         (float)count);
        pos = next;
    }
    free(kinds);
    free(srcs);
    free(cur);
    return s;
}

/* Segment j of rank r's profile, q, in its region `base` of the exchange
 * buffer, whose fp32 part has n_f elements: where element x's slot is, as
 * an fp32 (*f) or, inside a bf16 master's copy, a bf16 (*h), and the end
 * of x's run of one kind (below end; *copy as st_mpi_copy_run's). */
static uint64_t slot_of(const mpi_comm *mc, int r, size_t j, float *base, size_t n_f,
                        uint64_t x, uint64_t end, float **f, uint16_t **h, int *copy)
{
    const prof_seg *q = &mc->prof[r][j];
    const uint64_t e = st_mpi_copy_run(mc, x, end, copy);
    const uint64_t in = st_mpi_copied_in(mc, q->begin, x);
    const size_t f0 = mc->copies_master ? mc->f_off[r][j] : q->off;
    *f = base + f0 + (x - q->begin - in);
    *h = (uint16_t *)(void *)(base + n_f) + (q->off - f0) + in;
    return e;
}

/* Owner w's master values (a bf16 master: its copies' values) into the
 * receive buffer's slots of every other rank that holds them: what the
 * all-gather's exchange sends back. */
static st_status build_ag_out(const mpi_comm *mc, int w, list *items)
{
    const int me = mc->rank, g = mc->first[me] + w;
    const uint64_t b0 = mc->shard_begin[g], b1 = mc->shard_begin[g + 1];
    const mpi_worker *o = &mc->workers[w];
    for (int r = 0; r < mc->size; r++) {
        if (r == me || mc->ag_src_direct[r])   /* direct: sent from the master itself */
            continue;
        float *base = mc->recv + mc->recv_off[r];
        for (size_t j = 0; j < mc->n_prof[r]; j++) {
            const prof_seg *q = &mc->prof[r][j];
            if (q->end <= b0 || q->begin >= b1)
                continue;    /* segments never straddle a shard boundary */
            for (uint64_t x = q->begin; x < q->end;) {
                float *f;
                uint16_t *h;
                int c;
                const uint64_t e = slot_of(mc, r, j, base, mc->recv_f[r], x, q->end, &f, &h, &c);
                ag_item *it = st_mpi_list_push(items);
                if (!it)
                    return st_mpi_no_memory();
                const uint16_t *copy = c < 0 ? NULL
                                             : o->copies[c].bf16 + (x - o->copies[c].offset);
                if (c < 0)
                    *it = (ag_item){ f, o->master + (x - b0), e - x, NULL, NULL, 0 };
                else
                    *it = (ag_item){ NULL, (const float *)(const void *)copy, e - x, h, NULL, 0 };
                x = e;
            }
        }
    }
    return ST_OK;
}

/* Which of w's weight copies its replica's items write as they copy:
 * bit 1, its bf16 copies (not a bf16 master's, which come as bf16); bit
 * 2, its blocked copies.  Not a kind that a part the exchange receives in
 * place reaches: converting there would be the layer's own pass over the
 * weights, earlier and farther from the product that reads the copy. */
enum { FUSE_COPIES = 1, FUSE_BLOCKED = 2 };

/* Whether local elements [at, at + n) of w meet one of its bf16 copies,
 * one of its blocked copies. */
static int meets_copies(const mpi_worker *v, size_t at, size_t n)
{
    for (int c = 0; c < v->n_copies; c++)
        if (v->copies[c].offset < at + n && v->copies[c].offset + v->copies[c].count > at)
            return 1;
    return 0;
}

static int meets_blocked(const mpi_worker *v, size_t at, size_t n)
{
    for (int b = 0; b < v->n_blocked; b++) {
        const st_param_blocked *p = &v->blocked[b];
        if (p->offset < at + n && st_blocked_end(p) > at)
            return 1;
    }
    return 0;
}

static int fused_copies(const mpi_comm *mc, int w)
{
    const int me = mc->rank;
    const mpi_worker *v = &mc->workers[w];
    int fuse = (mc->copies_master || v->n_copies == 0 ? 0 : FUSE_COPIES) |
               (v->n_blocked == 0 ? 0 : FUSE_BLOCKED);
    for (int i = 0; i < v->n_held && fuse; i++)
        for (uint64_t x = v->held[i].begin; x < v->held[i].end;) {
            const int d = st_mpi_rank_of_element(mc, x);
            uint64_t e = mc->shard_begin[mc->first[d + 1]];   /* rank d's elements end */
            e = e < v->held[i].end ? e : v->held[i].end;
            const size_t at = v->local[i] + (x - v->held[i].begin);
            if (d != me && mc->ag_dst_direct[d]) {
                if (meets_copies(v, at, e - x))
                    fuse &= ~FUSE_COPIES;
                if (meets_blocked(v, at, e - x))
                    fuse &= ~FUSE_BLOCKED;
            }
            x = e;
        }
    return fuse;
}

/* Where an fp32 item into w's replica from local element at (below
 * at + len) ends: at an edge of the copies `fuse` names.  *half: where
 * element at's bf16 copy is; *blk: the blocked copies it lies in; NULL:
 * none. */
static size_t replica_cut(const mpi_worker *v, int fuse, size_t at, size_t len,
                          uint16_t **half, const st_param_blocked **blk)
{
    *half = NULL;
    *blk = NULL;
    for (int c = 0; (fuse & FUSE_COPIES) && c < v->n_copies; c++) {
        const st_param_copy *p = &v->copies[c];
        if (p->offset + p->count <= at)
            continue;
        if (p->offset <= at) {
            *half = p->bf16 + (at - p->offset);
            return p->offset + p->count - at < len ? p->offset + p->count - at : len;
        }
        len = p->offset - at < len ? p->offset - at : len;
        break;
    }
    for (int b = 0; (fuse & FUSE_BLOCKED) && b < v->n_blocked; b++) {
        const st_param_blocked *p = &v->blocked[b];
        const size_t end = st_blocked_end(p);
        if (end <= at)
            continue;
        if (p->offset <= at) {
            *blk = p;
            return end - at < len ? end - at : len;
        }
        return p->offset - at < len ? p->offset - at : len;
    }
    return len;
}

/* Worker w's replica: each held piece from the local owner's master (its
 * own rank shard) or from the slot the all-gather's exchange filled; an
 * fp32 piece in its blocked copies packs them. */
static st_status build_ag_in(const mpi_comm *mc, int w, list *items)
{
    const int me = mc->rank;
    const mpi_worker *v = &mc->workers[w];
    const int fuse = fused_copies(mc, w);
    const prof_seg *p = mc->prof[me];
    size_t j = 0;
    for (int i = 0; i < v->n_held; i++) {
        uint64_t pos = v->held[i].begin, end = v->held[i].end;
        while (pos < end) {
            while (j < mc->n_prof[me] && p[j].end <= pos)
                j++;
            /* w holds pos, so the local profile covers it */
            const prof_seg *q = &p[j];
            uint64_t stop = q->end < end ? q->end : end;
            int d = st_mpi_rank_of_element(mc, pos);
            if (d != me && mc->ag_dst_direct[d]) {   /* received in place */
                pos = stop;
                continue;
            }
            /* a bf16 master's copies come as bf16: from the local owner's
             * copy (w's own: its update wrote it), or from the exchange;
             * else the fp32 replica, which the model converts */
            int o = -1, g = mc->first[me];
            if (d == me) {
                while (mc->shard_begin[g + 1] <= pos)
                    g++;
                o = g - mc->first[me];
            }
            for (uint64_t x = pos; x < stop;) {
                float *f = NULL;
                uint16_t *h = NULL;
                int c;
                uint64_t e = d == me ? st_mpi_copy_run(mc, x, stop, &c)
                                     : slot_of(mc, me, j, mc->send + mc->send_off[d],
                                               mc->send_f[d], x, stop, &f, &h, &c);
                const size_t at = v->local[i] + (x - v->held[i].begin);
                uint16_t *half = NULL;
                const st_param_blocked *blk = NULL;
                if (c < 0)
                    e = x + replica_cut(v, fuse, at, e - x, &half, &blk);
                if (d == me && c < 0)
                    f = mc->workers[o].master + (x - mc->shard_begin[g]);
                else if (d == me)
                    h = mc->workers[o].copies[c].bf16 + (x - mc->copies[c].offset);
                if (c >= 0 && o == w) {
                    x = e;
                    continue;
                }
                ag_item *it = st_mpi_list_push(items);
                if (!it)
                    return st_mpi_no_memory();
                if (c < 0)
                    *it = (ag_item){ v->params + at, f, e - x, half, blk, at };
                else
                    *it = (ag_item){ NULL, (const float *)(const void *)h, e - x,
                                     v->copies[c].bf16 + (x - v->copies[c].offset), NULL,
                                     0 };
                x = e;
            }
            pos = stop;
        }
    }
    return ST_OK;
}

/* Bytes an rs item reads per element: each op's a (and b of a sum of
 * two), 2 for a bf16 source, 4 for the others. */
static size_t item_sources_bytes(const rs_item *it, const rs_op *ops)
{
    size_t b = 0;
    for (size_t j = 0; j < it->n_ops; j++) {
        const rs_op *op = &ops[it->op_first + j];
        b += op->a_src == SRC_BF16 ? sizeof(uint16_t) : sizeof(float);
        if (op->kind == OP_SUM2)
            b += op->b_src == SRC_BF16 ? sizeof(uint16_t) : sizeof(float);
    }
    return b;
}

st_status st_mpi_step_lists(mpi_comm *mc, int w)
{
    mpi_worker *me = &mc->workers[w];
    list pack = { NULL, 0, 0, sizeof(rs_item) }, pack_ops = { NULL, 0, 0, sizeof(rs_op) };
    list own = { NULL, 0, 0, sizeof(rs_item) }, own_ops = { NULL, 0, 0, sizeof(rs_op) };
    list ag_out = { NULL, 0, 0, sizeof(ag_item) }, ag_in = { NULL, 0, 0, sizeof(ag_item) };
    st_status s = ST_OK;
    if (mc->roles & ST_COMM_REDUCE) {
        s = st_mpi_build_pack(mc, w, 0, &pack, &pack_ops);
        if (s == ST_OK)
            s = st_mpi_build_own(mc, w, 0, me->shard_grad, &own, &own_ops);
    }
    if (s == ST_OK && (mc->roles & ST_COMM_GATHER)) {
        s = build_ag_out(mc, w, &ag_out);
        if (s == ST_OK)
            s = build_ag_in(mc, w, &ag_in);
    }
    void *v;
    if (s == ST_OK && (s = list_to_arena(me->arena, &pack, &v)) == ST_OK)
        me->pack = v, me->n_pack = pack.n;
    if (s == ST_OK && (s = list_to_arena(me->arena, &pack_ops, &v)) == ST_OK)
        me->pack_ops = v;
    if (s == ST_OK && (s = list_to_arena(me->arena, &own, &v)) == ST_OK)
        me->own = v, me->n_own = own.n;
    if (s == ST_OK && (s = list_to_arena(me->arena, &own_ops, &v)) == ST_OK)
        me->own_ops = v;
    if (s == ST_OK && (s = list_to_arena(me->arena, &ag_out, &v)) == ST_OK)
        me->ag_out = v, me->n_ag_out = ag_out.n;
    if (s == ST_OK && (s = list_to_arena(me->arena, &ag_in, &v)) == ST_OK)
        me->ag_in = v, me->n_ag_in = ag_in.n;
    /* bytes: what w's items read and write, and (worker 0, which calls
     * MPI) what the rank receives from the others */
    st_comm_bytes *by = &me->bytes;
    memset(by, 0, sizeof *by);
    const rs_item *it = pack.v;
    const size_t n_send = mc->send_off[mc->size - 1] + mc->send_len[mc->size - 1];
    for (size_t t = 0; s == ST_OK && t < pack.n; t++) {
        by->read += it[t].n * item_sources_bytes(&it[t], pack_ops.v);
        by->written += it[t].n * sizeof(float);
        if (mc->bf16 && mc->send && it[t].out >= mc->send && it[t].out < mc->send + n_send) {
            by->read += it[t].n * sizeof(float);          /* to_payload */
            by->written += it[t].n * sizeof(uint16_t);
        }
    }
    it = own.v;
    for (size_t t = 0; s == ST_OK && t < own.n; t++) {
        by->read += it[t].n * item_sources_bytes(&it[t], own_ops.v);
        by->written += it[t].n * sizeof(float);
    }
    /* an ag item moves fp32, or (no dst) a bf16 master's copy */
    const ag_item *ai = ag_out.v;
    for (size_t t = 0; s == ST_OK && t < ag_out.n; t++)
        by->gather_read += ai[t].n * (ai[t].dst ? sizeof(float) : sizeof(uint16_t));
    by->gather_written = by->gather_read;
    ai = ag_in.v;
    size_t copied = 0, packed = 0, want = 0;
    for (size_t t = 0; s == ST_OK && t < ag_in.n; t++) {
        const size_t moved = ai[t].n * (ai[t].dst ? sizeof(float) : sizeof(uint16_t));
        by->gather_read += moved;
        by->gather_written += moved;
        if (ai[t].dst && ai[t].half) {
            copied += ai[t].n;
            by->gather_written += ai[t].n * sizeof(uint16_t);
        }
        if (ai[t].blk) {
            packed += ai[t].n;
            by->gather_written += ai[t].n * sizeof(uint16_t) * (size_t)ai[t].blk->n;
        }
    }
    /* a replica's copies are the model's to make unless every element of
     * them comes with an item (fused_copies); a bf16 master's come as
     * bf16 */
    for (int c = 0; !mc->copies_master && c < me->n_copies; c++)
        want += me->copies[c].count;
    me->copies_gathered = s == ST_OK && !mc->copies_master && me->n_copies > 0 &&
                          copied == want;
    want = 0;
    for (int b = 0; b < me->n_blocked; b++)
        want += (size_t)(me->blocked[b].rows * me->blocked[b].cols);
    me->blocked_gathered = s == ST_OK && me->n_blocked > 0 && packed == want;
    by->read += by->gather_read;
    by->written += by->gather_written;
    if (w == 0) {
        by->cross_domain_read = mc->mpi_bytes;
        by->read += mc->mpi_bytes;
    }
    free(pack.v);
    free(pack_ops.v);
    free(own.v);
    free(own_ops.v);
    free(ag_out.v);
    free(ag_in.v);
    return s;
}

#endif /* HAVE_MPI */
