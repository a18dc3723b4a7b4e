/*
 * nn/graph.h — private: a model is an ordered table of layers.
 *
 * A model builder (src/nn/models/) declares, in forward order, the layers
 * of the FULL model and the tensors between them; everything else is
 * generic (graph_declare.c: the declaration and layout; graph.c: memory,
 * primitives and the loops):
 *
 *   layout   one walk over the table gives the flat parameter vector: each
 *            layer kind appends its named segments (weight, bias, gamma,
 *            beta).  A segment's place in the full model (offset, RNG
 *            stream) is where the walk meets it, whether or not this
 *            instance keeps it;
 *   memory   params, grads, then every tensor and each layer's own saved
 *            buffers, from the worker's arena;
 *   build    each layer kind creates its oneDNN primitives once, against
 *            those buffers;
 *   run      forward is one loop over the table, backward the same loop
 *            reversed (as oneDNN's training examples run net_fwd[] and
 *            net_bwd[]), with the loss in between.
 *
 * Subnetwork units are declared by the layers, not by the model:
 *
 *   layer groups   a layer belongs to group g (a residual block: the layers
 *                  between st_graph_group_begin and _end, with a skip edge
 *                  around them).  A model that does not keep group g leaves
 *                  its layers out and the group's output IS its input: the
 *                  identity.  Backward masking keeps the layers but not
 *                  their weight gradients.
 *   width units    a linear layer may declare that its output neurons form
 *                  width layer u (groups of neurons are the units); its
 *                  consumers declare u as their input.  A model keeping some
 *                  of u's neurons holds their rows of the producer's matrix
 *                  and the matching input slice (rows of an in-major matrix)
 *                  of the consumer; tensors of width u are as wide as the
 *                  kept neurons.
 *
 * So a new layer kind that declares these works with every strategy.
 *
 * Tensors are (rows, cols) row-major floats, rows = batch, or batch x
 * context for a sequence model (a row per token: row-wise kinds — linear,
 * norms, activations, adds, the loss — see tokens as samples; attention
 * is the one kind that mixes the rows of a sample).  Gradient tensors are
 * declared by the builder like the others and shared on purpose (a data
 * gradient is dead once the layer below has consumed it), which is what
 * keeps a deep model's backward in five buffers.
 */
#ifndef SUBTRAIN_NN_GRAPH_H
#define SUBTRAIN_NN_GRAPH_H

#include <subtrain/model.h>
#include "core/arena_impl.h"
#include "nn/graph_layer.h"

/* ------------------------------------------------------------ tensors */

/* Predeclared tensors: the model's input, its logits and their gradient. */
enum { ST_T_NONE = -1, ST_T_INPUT = 0, ST_T_LOGITS = 1, ST_T_DLOGITS = 2, ST_T_FIRST_FREE = 3 };

/* Width of a tensor or layer side: the full width, or that of width layer
 * u's kept neurons (u >= 0), or of the widest kept width layer (shared
 * gradient scratch that every width layer passes through). */
enum { ST_W_FULL = -1, ST_W_WIDEST = -2 };

typedef struct st_tensor {
    int64_t cols;          /* full width: channels x h x w */
    int64_t channels, h, w;/* an image (NCHW per sample); a vector: cols x 1 x 1 */
    int width_unit;        /* ST_W_FULL, ST_W_WIDEST, or a width layer */
    int group;             /* the layer group that writes it (-1: none):
                            * not allocated when the group is dropped */
    int alias;             /* a dropped group's output: the tensor it is */
    int64_t widest_of;     /* ST_W_WIDEST: the widest kept width layer of this
                            * full width only (0: of any) */
    int copies;            /* of its width: a row is `copies` runs of the
                            * width's kept units back to back (attention's
                            * Q, K and V: 3); 1 otherwise */
    int64_t tokens;        /* rows per sample (a ViT's patches); 0: the
                            * model's (m->rows / batch) */
    int half;              /* stored as bf16, 2 bytes an element (st_graph_half
                            * decides it when the model is built): data then
                            * points at st_bf16 values (st_graph_data_bf16) */
    float *data;           /* (rows, copies x width) */
} st_tensor;

/* ------------------------------------------------------------ the model */

/* The table's layers, and what their kinds provide: nn/graph_layer.h. */

/* A model's declaration: appends its tensors and layers (models/) for its
 * configuration, m->cfg. */
typedef st_status (*st_model_declare_fn)(st_model *m);

/* Where a segment's elements come from in the full model, element by
 * element: compact storage row r, column c is full row rows[r], column
 * cols[c].  Everything that relates a subnetwork to the full model (its
 * initial values, its full-layout ranges for the reduction engine) is
 * computed from this, for group and width subnetworks alike. */
typedef struct st_seg_map {
    size_t full_offset;            /* the full tensor's first element in the full vector */
    int64_t full_rows, full_cols;  /* storage shape of the full tensor (a vector: n x 1) */
    const int32_t *rows, *cols;    /* compact -> full (NULL: the same index) */
    int64_t n_rows, n_cols;        /* compact storage shape */
    const int32_t *grad_rows;      /* backward masking: full rows that get a
                                    * gradient (NULL: every row) */
    int64_t n_grad_rows;
    const int32_t *grad_cols;      /* backward masking: full columns that get a
                                    * gradient (NULL: every stored column); the
                                    * gradient is grad rows x grad cols, row-major */
    int64_t n_grad_cols;
    int in_major;                  /* a weight stored (in, out) */
    int64_t fan_in;                /* of the full layer: the init bound */
    uint64_t stream;               /* init RNG stream: the full segment's index */
} st_seg_map;

/* One width layer's kept neurons (full indices, increasing). */
typedef struct st_neuron_sel {
    int64_t full, n;               /* full width, kept */
    const int32_t *ids;            /* NULL: all (n == full) */
} st_neuron_sel;

struct st_model {
    st_model_config cfg;
    st_model_declare_fn declare;   /* its kind's builder (or the caller's) */
    int batch;
    int64_t rows;          /* of every tensor: batch (x context for a sequence model) */
    st_arena *arena;       /* NULL: layout only (no memory, no primitives) */
    int range;             /* an instance of a range of the table's layers
                            * (st_model_create_range): no fusion across layers */
    st_nn_ctx ctx;

    /* The table, in forward order, and its tensors. */
    st_layer *layers;
    int n_layers, cap_layers;
    st_tensor *tensors;
    int n_tensors, cap_tensors;
    int open_group;        /* while declaring: the group being declared */
    int open_section;      /* while declaring: the section layers join */
    int64_t open_tokens;   /* while declaring: the rows per sample of new
                            * tensors (st_graph_tokens; 0: the model's) */
    int open_block;        /* while declaring: st_graph_block's block (-1: none) */
    int n_groups;          /* layer groups of the full model */
    int n_width;           /* width layers of the full model */

    /* Layer groups: held[g] = index among the kept groups + 1 (0: not
     * held), grad[g] = 1: its weight gradients are kept (cfg's
     * group_grads points here). */
    int *group_held;
    uint8_t *group_grad;
    int *group_ids;        /* the config's held groups, copied: cfg points here */

    /* Flat parameters and gradients (same layout), and their segments. */
    float *params, *grads;
    size_t n_params, n_grads;
    st_model_storage storage;  /* params (and bf16 copies) not its own
                            * (st_model_create_on); zero: its own */
    /* State that is not trained but kept (a batch norm's running
     * statistics): one flat vector, laid out by the same walk, each
     * piece with its initial value. */
    float *state;
    size_t n_state;
    st_param_segment *state_segs;
    float *state_init;     /* n_state_segs initial values */
    st_neuron_sel *state_sel; /* n_state_segs: which elements of the full
                            * model's piece each one keeps (full: its
                            * length there; ids NULL: all of them) */
    size_t *state_full;    /* n_state_segs: the piece's first element in
                            * the full model's state vector */
    size_t n_state_full;   /* floats of state of the full model */
    int n_state_segs, cap_state_segs;
    int layout_grads;      /* while laying out: the segment gets a gradient */
    int layout_skip;       /* while laying out: a dropped layer's segments
                            * only move the full cursor */
    float *norm_scratch;   /* dgamma, dbeta of norms without gradient */
    int64_t norm_scratch_cols;
    float *grad_scratch;   /* full weight gradients of backward-masked layers */
    size_t grad_scratch_floats;
    size_t *grads_final;   /* n_layers: after layer i's backward (the layers run
                            * from the last), the gradient elements from
                            * grads_final[i] on are written for the pass */
    st_param_segment *segs;
    st_seg_map *maps;      /* n_segs, parallel to segs */
    /* bf16: the layers' weight copies that lie in params, by offset
     * (st_model_copies; none with ST_UNFUSE_WEIGHT_COPY) */
    st_param_copy *copies;
    int n_copies;
    /* --weight-layout blocked: the blocked copies, by offset
     * (st_model_blocked_copies; none with ST_UNFUSE_WEIGHT_COPY) */
    st_param_blocked *blocked;
    int n_blocked;
    int n_segs, cap_segs;
    size_t full_at;        /* while laying out: the next segment's full offset */
    uint64_t full_seg;     /*                   and full index */

    /* Width layers: kept neurons (forward masking) and neurons with
     * gradients (backward masking), and the latter as runs of rows. */
    st_neuron_sel *keep, *grad_keep;
    int *kept;             /* the model's own copies of cfg's width_count, then
                            * of its width_kept: cfg points here */
    int32_t *ids;
    st_row_run *runs;      /* backward masking: grad_keep as runs, per layer at
                            * run_first[u]; NULL otherwise */
    int *run_first, *run_count;
    int64_t widest;        /* widest kept width layer */

    /* Recomputation (nn/recompute.c), cfg.recompute: the kept blocks as
     * runs of layers, each layer's kept block (-1: none) and each
     * tensor's lane (-1: its own storage), and the lanes the arena hands
     * the blocks' activations from while the model is built. */
    int n_blocks;
    int *block_lo, *block_hi;
    int *layer_block, *tensor_lane;
    st_arena_lanes lanes;
    int *lane_region;
    size_t *lane_used;
    int regions_known;     /* 1: region_size holds the regions to allocate;
                            * 0: the lanes count (st_model_activation_layout) */
    size_t region_size[ST_ARENA_REGIONS][ST_MEM_KIND_COUNT];

    int32_t *labels;       /* (B) */
    float *logp;           /* (B, classes) */
    st_xent xent;

    /* A sizing run's shell (nn/model_memo.h): the prototype whose tables
     * it reads; its buffers are its own.  NULL: a model built. */
    const st_model *proto;
};

/* ------------------------------------------------------------ builders */

/* A model kind: one file of src/nn/models/, NAME.c, defines its entry
 * st_model_NAME, and its name in model.c's MODEL_KINDS lists it (its place
 * there is its st_model_kind).  The entry is everything the library and a front end
 * (the command line) know of the kind: its name and what --help says of
 * it, what it reads, the options it takes, their defaults, its checks,
 * its banner words and its declaration. */
typedef struct st_model_builder {
    const char *name;              /* --model NAME; a weights file's subtrain.model */
    const char *help;              /* --help's words on it, NULL: none */
    st_model_reads reads;
    unsigned options;              /* the ST_MODEL_OPT_* it takes */
    /* The defaults of the options not given (ST_MODEL_OPT_* bits of
     * `given`) where they differ from st_model_config_default()'s, and
     * fields they imply (gpt: in_dim, n_classes); NULL: none. */
    void (*defaults)(st_model_config *c, unsigned given);
    /* The options given that it refuses with words of its own, or sizes
     * it cannot take, as usage errors naming the option; NULL: none.
     * (An option it does not take is refused by model.c otherwise.) */
    st_status (*check_options)(const st_model_config *c, unsigned given);
    /* Checks of a whole configuration beyond the fields every model
     * checks (st_model_config_check); NULL: none. */
    st_status (*check)(const st_model_config *c);
    /* The banner's words after "NAME depth D width W" (" hidden 256"),
     * into out (n bytes); NULL: none. */
    void (*describe)(const st_model_config *c, char *out, size_t n);
    /* Appends the full model's tensors and layers.  A kind that reads
     * images is declared only with an image shape (model.c refuses the
     * rest in the kind's name). */
    st_model_declare_fn declare;
} st_model_builder;

/* A new tensor of `cols` full columns (width: ST_W_FULL, ST_W_WIDEST or a
 * width layer), written by the open group if any; its id. */
int st_graph_tensor(st_model *m, int64_t cols, int width);
/* The same holding `copies` runs of cols (of width's kept units) per row. */
int st_graph_tensor_copies(st_model *m, int64_t cols, int copies, int width);
/* Shared gradient scratch of `copies` x cols per row that only width
 * layers of full width `cols` pass through: as wide as the widest of
 * them is kept (ST_W_WIDEST of those; a model whose width layers differ,
 * a transformer's heads and MLP neurons, needs one per kind). */
int st_graph_tensor_widest_of(st_model *m, int64_t cols, int copies);
/* The same for images of `channels` x h x w per sample (NCHW): a width
 * layer's units are then groups of channels, each h x w. */
int st_graph_image(st_model *m, int64_t channels, int64_t h, int64_t w, int width);
/* The tensors declared from now on have `tokens` rows per sample (0:
 * the model's, a row per sample or per token of its context): a model
 * whose inner tensors have a row per patch and whose logits a row per
 * sample (the ViT) declares its token tensors after st_graph_tokens(T). */
void st_graph_tokens(st_model *m, int64_t tokens);
/* Rows of a tensor in this instance: batch x its tokens. */
int64_t st_graph_rows(const st_model *m, int tensor);
/* The tensor t is (a dropped group's output is its input), ST_T_NONE for
 * none. */
int st_graph_resolve(const st_model *m, int t);
/* A tensor as declared (its alias resolved: a dropped group's output is
 * its input). */
const st_tensor *st_graph_tensor_info(const st_model *m, int tensor);
/* The memory layout of an image tensor as a layer sees it, `channels` of
 * it (a subnetwork's layer may see kept channels only): oneDNN's blocked
 * layout (st_blocked_tag: nChw16c with AVX-512) when they are whole
 * blocks, so that consecutive convolutions and batch norms pass their
 * tensors on without reordering them; else plain NCHW, and always for
 * the model's input (the data is gathered as NCHW) and for vectors
 * (H = W = 1).  The rule depends on the shape only, so every layer that
 * touches a tensor sees the same layout, and elementwise kinds
 * (activations, skips), which do not care, stay consistent.  Blocked and
 * plain take the same memory when the channels are whole blocks.  Where
 * the model's layout resolves to NHWC (st_tensor_layout_resolve) every
 * image tensor but the input is channels last, whatever its channels. */
dnnl_format_tag_t st_graph_tag(const st_model *m, int tensor, int64_t channels);
/* Floats per sample of a tensor in this instance: its full width, or its
 * width layer's kept units times the elements of one channel. */
int64_t st_graph_cols(const st_model *m, int tensor);

/* Appends a layer; the graph fills in its group.  Returns it, NULL when
 * out of memory (the model then fails to build). */
st_layer *st_graph_add(st_model *m, const st_layer_kind *kind, const char *name, int x,
                       int y, int dx, int dy);

/* A linear layer (in -> out features) between tensors x and y. */
st_layer *st_graph_linear(st_model *m, const char *name, int x, int y, int dx, int dy,
                          int64_t in, int64_t out);
/* A linear layer and its activation, x -> a -> z = act(a), with new
 * tensors a and z of width layer `unit` (the linear's out_unit; its
 * in_unit is the caller's to set) and the gradients da, dz.  A ReLU runs
 * in the matmul's epilogue (a post-op) writing z itself, with no tensor
 * a: the activation layer then computes only its backward, from z, or
 * (fold_relu, set by the caller on it and the linear layer after it)
 * a mask that layer's backward-data product multiplies by
 * (nn/layers/activation.c).  Returns the activation layer (the linear is
 * the one before it; z is its y), NULL when out of memory. */
st_layer *st_graph_linear_act(st_model *m, const char *name, int x, int dx, int da, int dz,
                              int64_t in, int64_t out, int unit, st_activation act);
/* Whether st_graph_linear_act runs activation `act` as its matmul's
 * post-op in model m (its activation layer's fuse_relu). */
int st_graph_fuses_relu(const st_model *m, st_activation act);

/* Layer group g: the layers declared until st_graph_group_end.  Its
 * output tensor is its input when a model does not hold it. */
void st_graph_group_begin(st_model *m, int g);
/* The groups declared from now on are in section s (a ResNet's stage;
 * every model starts in section 0): strategies that deal groups to
 * workers deal each section's evenly (st_model_config_sections). */
void st_graph_section(st_model *m, int s);
/* Outside layer groups: the layers declared from now on are
 * recomputation block b (-1: none; cfg.recompute, nn/recompute.c), mlp's
 * hidden layers, a ResNet's projection blocks.  A layer group is a block
 * of its own. */
void st_graph_block(st_model *m, int b);
void st_graph_group_end(st_model *m, int in, int out);

/* For layer kinds: untrained state named `name`, sel->full floats in the
 * full model of which this instance keeps sel->n (sel->ids; NULL: all),
 * all `init` at the start; *offset is where they sit in the state vector
 * ((size_t)-1 for a dropped layer).  Like a parameter segment, the piece
 * has its place in the full model's state vector, where strategies
 * average what the workers holding it keep (st_model_state_accumulate). */
st_status st_graph_add_state(st_model *m, const char *name, const st_neuron_sel *sel,
                             float init, size_t *offset);
float *st_graph_state(const st_model *m, size_t offset);

/* For layer kinds: a segment of the parameter vector (see model.c). */
st_status st_graph_add_segment(st_model *m, const char *name, int decay, st_seg_map map,
                               size_t *index);
float *st_graph_data(const st_model *m, int tensor);
/* A tensor stored as bf16 (st_tensor.half): its values; NULL for a tensor
 * stored as fp32 (or ST_T_NONE).  Valid once st_graph_half has run. */
st_bf16 *st_graph_data_bf16(const st_model *m, int tensor);
/* Whether tensor t is stored as bf16 (0 for ST_T_NONE). */
int st_graph_is_half(const st_model *m, int tensor);
int64_t st_graph_width(const st_model *m, int width);
/* A width layer's kept neurons (all of them for ST_W_FULL of n features). */
const st_neuron_sel *st_graph_sel(const st_model *m, int width, int64_t n, st_neuron_sel *tmp);
const st_neuron_sel *st_graph_grad_sel(const st_model *m, int width);
/* Runs of rows with a weight gradient of width layer u (NULL: all). */
const st_row_run *st_graph_grad_runs(const st_model *m, int u, int *n);
float *st_graph_seg_params(const st_model *m, size_t seg);
float *st_graph_seg_grads(const st_model *m, size_t seg);   /* NULL: none */
st_status st_graph_alloc(st_model *m, size_t count, float **out);
/* dgamma, dbeta scratch for a norm of `cols` whose parameters get no
 * gradient (backward masking): shared by all such norms. */
float *st_graph_norm_scratch(const st_model *m);
/* The full weight gradients of a layer under backward masking of width
 * units whose primitive computes them all (grad_scratch of its kind):
 * shared by all such layers, written and read within one backward (or one
 * forward: attention's bf16 scores). */
float *st_graph_grad_scratch(const st_model *m);
/* Copies the kept part of a full (rows, cols) row-major gradient src into
 * the compact dst, back to back: the rows of `rows` (NULL: all `n_all`
 * rows), and of each the columns of `cols` in units of col_unit columns
 * (NULL: all).  memcpy of runs: no allocation. */
void st_graph_gather(float *dst, const float *src, int64_t n_all, int64_t full_cols,
                     const st_row_run *rows, int n_rows, const st_row_run *cols, int n_cols,
                     int64_t col_unit);

/* model.c: an instance of layers lo .. hi (table indices) of cfg's model
 * only, with no loss and no workspace yet: a segment (nn/segment.c) adds
 * its loss's primitives, then calls st_nn_ctx_finalize.  Its input is
 * layers[lo].x, its output layers[hi].y, whose gradient is layers[hi].dy.
 * Models with layer groups are refused. */
st_status st_model_create_range(const st_model_config *cfg, int lo, int hi, int batch,
                                st_arena *arena, st_model **out);
/* model.c: a whole model that the caller declares (a layer kind or a
 * model not in the library yet: tests, experiments).  cfg's sizes and
 * subnetwork are checked against this declaration; its kind is not used. */
st_status st_model_create_declared(const st_model_config *cfg, st_model_declare_fn declare,
                                   int batch, st_arena *arena, st_model **out);
/* The table index of the n-th (0-based) layer of `kind` in cfg's model;
 * -1 if there is none. */
int st_model_layer_index(const st_model_config *cfg, const st_layer_kind *kind, int n);

/* graph_declare.c (declare, layout, free) and graph.c (build, run): the
 * steps of st_model_create / the layout-only path. */
st_status st_graph_declare(st_model *m, st_model_declare_fn declare);
                                               /* the builder, then units */
st_status st_graph_layout(st_model *m);        /* segments */
st_status st_graph_build(st_model *m);         /* memory and primitives */
/* Part of st_graph_build, before any memory: marks st_tensor.half, in
 * bf16 (--precision bf16) only, on each tensor that every layer touching
 * it can take as bf16 (st_layer_kind.bf16_io): written by layers that can
 * write it as bf16 (ST_BF16_Y) and read as x only, by layers that can
 * read it as bf16 (ST_BF16_X); a data gradient only where every layer
 * touching it says ST_BF16_DX / ST_BF16_DY (and not the last layer's
 * dy); never a residual, the
 * model's predeclared tensors, a tensor read before this instance writes
 * it (a range's input) or the output of the last layer (the loss, or the
 * next range, reads it), nor, in a range, a tensor a layer outside it
 * touches; a layer with ST_BF16_TIED takes x and y both as bf16 or
 * neither (ST_BF16_TIED_GRADS: dx and dy with them).  fp32: nothing is
 * marked. */
st_status st_graph_half(st_model *m);
st_status st_graph_forward(const st_model *m, st_phase phase);
/* The training forward of a step (nn/model.c): its weight copies are then
 * stale until the update or the all-gather writes them again. */
st_status st_model_train_forward(st_model *m);
st_status st_graph_backward(const st_model *m);
/* The same, calling ready(ctx, from) after each layer whose backward makes
 * more of the gradient vector final: elements [from, n_grads) (from only
 * decreases; 0 after the last layer that writes gradients). */
st_status st_graph_backward_ready(const st_model *m, void (*ready)(void *ctx, size_t from),
                                  void *ctx);
double st_graph_flops(const st_model *m);
void st_graph_free(st_model *m);               /* what declare and layout malloc'd */

/* nn/recompute.c: the recomputation plan of a model being built
 * (cfg.recompute), the lanes its build allocates from, and the forward
 * the backward runs again before a block's backward. */
st_status st_recompute_plan(st_model *m);
/* The lane of tensor t's storage (its block's, a boundary's, or none),
 * of layer i's own buffers, opened for the allocations that follow;
 * close: none. */
void st_recompute_open_tensor(st_model *m, int t);
void st_recompute_open_layer(st_model *m, int i);
void st_recompute_close(st_model *m);
/* The build is over: the arena hands out its own storage again. */
void st_recompute_done(st_model *m);
/* Whether tensor t (resolved) may share a bf16 forward-only buffer: its
 * forward touches are all in one block (or none). */
int st_recompute_one_block(const st_model *m, int t);
/* Before layer i's backward: the forward its block's backward needs,
 * when i is a kept block's last layer. */
st_status st_recompute_before(const st_model *m, int i);
/* The FLOPs a step's recomputed forwards add (the runs st_recompute_before
 * makes), a layer's forward counted as a third of its step FLOPs: its
 * forward, backward-data and backward-weights products are of one size. */
double st_recompute_flops(const st_model *m);
/* The forwards run again, as st_cost_layer's forward-only costs. */
void st_recompute_costs(const st_model *m, st_cost_sink *s);
/* A layer's costs into s (nn/costs.c). */
void st_cost_layer(const st_model *m, const st_layer *l, int forward_only, st_cost_sink *s);
void st_recompute_free(st_model *m);

#endif /* SUBTRAIN_NN_GRAPH_H */
