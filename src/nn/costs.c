/*
 * nn/costs.c — a training step's work, layer by layer
 * (st_model_step_costs): what `subtrain plan` prices at a calibration's
 * rates.  The kinds with products say theirs (st_layer_kind.costs); the
 * others' element-wise passes are counted from their tensors.
 */
#include <string.h>

#include "nn/graph.h"
#include "nn/graph_layer.h"

void st_cost_add(st_cost_sink *s, st_step_cost c)
{
    for (int i = 0; i < s->n && i < s->cap; i++) {
        st_step_cost *e = &s->out[i];
        const int same = c.kind == ST_COST_PASS
                             ? e->kind == c.kind && e->op == c.op && e->backward == c.backward &&
                                   e->bytes * c.calls == c.bytes * e->calls
                             : e->kind == c.kind && e->bf16 == c.bf16 &&
                                   e->operands == c.operands && e->heads == c.heads &&
                                   e->m == c.m && e->n == c.n &&
                                   e->k == c.k;
        if (same) {
            e->count += c.count;
            e->flops += c.flops;
            e->bytes += c.bytes;
            e->elements += c.elements;
            e->calls += c.calls;
            return;
        }
    }
    if (s->n < s->cap)
        s->out[s->n] = c;
    s->n++;
}

void st_cost_matmul(st_cost_sink *s, int bf16, st_cost_operands operands, int64_t m, int64_t n,
                    int64_t k, double count, double calls)
{
    st_cost_add(s, (st_step_cost){ .kind = ST_COST_MATMUL, .bf16 = bf16, .operands = operands,
                                   .m = m, .n = n, .k = k,
                                   .count = count, .calls = calls,
                                   .flops = 2.0 * (double)m * (double)n * (double)k * count });
}

void st_cost_heads(st_cost_sink *s, int bf16, st_cost_operands operands, int64_t m, int64_t n,
                   int64_t k, double count)
{
    st_cost_add(s, (st_step_cost){ .kind = ST_COST_MATMUL, .bf16 = bf16, .operands = operands,
                                   .heads = 1, .m = m, .n = n, .k = k, .count = count,
                                   .calls = count,
                                   .flops = 2.0 * (double)m * (double)n * (double)k * count });
}

void st_cost_pass(st_cost_sink *s, st_cost_op op, int backward, double elements, double bytes,
                  double calls)
{
    if (bytes > 0.0)
        st_cost_add(s, (st_step_cost){ .kind = ST_COST_PASS, .op = op, .backward = backward,
                                       .count = calls, .calls = calls, .elements = elements,
                                       .bytes = bytes });
}

void st_cost_move(st_cost_sink *s, double bytes, double calls)
{
    st_cost_pass(s, ST_OP_MEMORY, 0, bytes / 4.0, bytes, calls);
}

void st_cost_xent(st_cost_sink *s, double logits)
{
    st_cost_pass(s, ST_OP_LOGSOFTMAX, 0, logits, 8.0 * logits, 1.0);
    st_cost_pass(s, ST_OP_LOGSOFTMAX, 1, logits, 12.0 * logits, 1.0);
}

double st_cost_tensor_bytes(const st_model *m, int t)
{
    return t == ST_T_NONE ? 0.0
                          : (st_graph_is_half(m, t) ? 2.0 : 4.0) * (double)st_graph_rows(m, t) *
                                (double)st_graph_cols(m, t);
}

void st_cost_layer(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s)
{
    if (l->kind->costs) {
        l->kind->costs(m, l, forward_only, s);
        return;
    }
    /* forward: x read, y written; backward: dy and x (or y) read, dx written */
    const double x = st_cost_tensor_bytes(m, l->x), y = st_cost_tensor_bytes(m, l->y);
    st_cost_move(s, x + y, 1.0);
    if (!forward_only && l->backward && l->kind->backward)
        st_cost_move(s, y + x + (l->dx == ST_T_NONE ? 0.0 : x), 1.0);
}

int st_model_step_costs(const st_model *m, st_step_cost *out, int cap)
{
    st_cost_sink s = { out, cap, 0 };
    /* the batch gathered into the input; the loss */
    st_cost_move(&s, 2.0 * st_cost_tensor_bytes(m, ST_T_INPUT), 1.0);
    st_cost_xent(&s, (double)(m->xent.batch * m->xent.classes));
    for (int i = 0; i < m->n_layers; i++)
        if (!m->layers[i].dropped)
            st_cost_layer(m, &m->layers[i], 0, &s);
    st_recompute_costs(m, &s);
    return s.n;
}
