/*
 * subtrain/model.h — model instances: builders, forward/backward, evaluation.
 *
 * A model instance is built for one batch size and owns everything one
 * worker needs to run it: its oneDNN engine, stream and primitives (created
 * once, here), its flat parameter and gradient vectors, its activations and
 * a shared oneDNN workspace, all taken from the caller's arena.  After
 * st_model_create(), a training step (fill the input, forward_backward)
 * allocates nothing and creates nothing.
 *
 * Models:
 *   mlp:    in -> [linear(.., width) -> act] x depth -> linear(width, classes)
 *   resmlp: linear(in, width)
 *           -> depth x { h += linear(hidden, width)(act(linear(width, hidden)(LN(h)))) }
 *           -> LN -> linear(width, classes)
 *   resnet:   image C x H x W -> conv 3x3 (C -> width) -> 3 stages of depth
 *             pre-activation basic blocks { h += conv(act(BN(conv(act(BN(h)))))) },
 *             width, 2 width, 4 width channels, the first block of stages 2
 *             and 3 with stride 2 and a 1x1 projection shortcut
 *             -> BN -> act -> global average pool -> linear(4 width, classes)
 *   resnet18: the same with 4 stages of 2 blocks (width .. 8 width)
 *   convnet:  image C x H x W -> depth stages { conv 3x3 -> BN -> act ->
 *             max pool 2x2 stride 2 }, width, 2 width, 4 width, ...
 *             channels -> global average pool -> linear(.., classes)
 *   gpt:      T byte tokens -> token + position embedding (width D)
 *             -> depth pre-norm blocks { h += proj(attn(qkv(LN(h))));
 *             h += fc2(act(fc1(LN(h)))) }, heads H, MLP hidden 4 D
 *             -> LN -> linear(D, 256): the next byte at every position
 *   vit:      image C x H x W -> its (H / P) (W / P) patches of P x P, each
 *             flattened and mapped by linear(C P P, D), a class token
 *             first (--pool cls) + position embedding
 *             -> depth pre-norm blocks as gpt's, attention not causal
 *             -> LN -> the class token or the tokens' mean -> linear(D, classes)
 * Sequence models (context > 0) run every tensor as (batch x context)
 * rows, one per token: in_dim is the context (one byte id per token),
 * the labels are context per sample (the next bytes) and the loss is the
 * mean over tokens.
 * Each is a table of layers (doc/design.md); the subnetwork units the
 * layers declare are reported by st_model_config_units.
 */
#ifndef SUBTRAIN_MODEL_H
#define SUBTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/arena.h>
#include <subtrain/params.h>
#include <subtrain/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A model kind: its place in the library's table of kinds (the order
 * --help lists them in, from 0).  Programs name kinds by their names
 * (st_model_kind_named, st_model_kind_parse): a kind the library adds
 * needs nothing here. */
typedef int st_model_kind;
typedef enum st_activation { ST_ACT_RELU, ST_ACT_GELU } st_activation;

/* What a model kind reads (st_model_kind_reads): vectors of features (any
 * data but text; images flattened), images (C x H x W, NCHW), or text
 * (byte ids: a sequence model). */
typedef enum st_model_reads {
    ST_MODEL_READS_FEATURES, ST_MODEL_READS_IMAGES, ST_MODEL_READS_TEXT
} st_model_reads;

/* The model options of a front end (the command line's --depth, ...): the
 * bits of st_model_kind_takes and of st_model_config_resolve's `given`. */
enum {
    ST_MODEL_OPT_DEPTH = 1u, ST_MODEL_OPT_WIDTH = 2u, ST_MODEL_OPT_HIDDEN = 4u,
    ST_MODEL_OPT_ACTIVATION = 8u, ST_MODEL_OPT_CONTEXT = 16u, ST_MODEL_OPT_HEADS = 32u,
    ST_MODEL_OPT_PATCH = 64u, ST_MODEL_OPT_POOL = 128u,
};

/* What a ViT's head reads: the mean of its tokens, or its class token. */
typedef enum st_token_pool { ST_POOL_MEAN, ST_POOL_CLS } st_token_pool;

/* Arithmetic of the matrix products (doc/precision.md).  BF16: linear
 * and convolution layers multiply bf16 copies of their weights and inputs
 * and of the output gradient, accumulating and writing fp32, and
 * attention's six products read bf16 copies of Q, K, V, the
 * probabilities, dY and dS (the probabilities are kept in bf16 only);
 * parameters, gradients, optimizer state, norms, activations' own math,
 * the scores, softmax and the loss stay fp32. */
typedef enum st_precision { ST_PRECISION_FP32, ST_PRECISION_BF16 } st_precision;

/* The layout of image tensors between layers (doc/cnn.md).  AUTO: the one
 * oneDNN's convolution picks on this CPU for the model's precision, channels
 * last (nhwc) where it picks that (AMX's bf16 kernels), else BLOCKED. */
typedef enum st_tensor_layout {
    ST_TENSOR_LAYOUT_AUTO = 0,
    ST_TENSOR_LAYOUT_BLOCKED, /* nChw16c with AVX-512, nChw8c below */
    ST_TENSOR_LAYOUT_NHWC,    /* channels last */
} st_tensor_layout;

/* How a bf16 linear layer's products read its weights (doc/precision.md).
 * PLAIN: one bf16 copy in the parameters' order, read through strides
 * (the kernel packs it on each call).  BLOCKED: two copies, each in the
 * blocked layout its product's kernel takes (queried with
 * format_tag_any from the forward and backward-data primitives), written
 * by a worker's own update or else converted by the layer. */
typedef enum st_weight_layout {
    ST_WEIGHT_LAYOUT_PLAIN = 0,
    ST_WEIGHT_LAYOUT_BLOCKED,
} st_weight_layout;

/* Activation recomputation (doc/memory.md): what the training forward
 * keeps for the backward.  A block is a layer group (a residual block),
 * or, in a model without groups, one hidden layer (its linear layer and
 * activation).  NONE: everything.  BLOCKS: each block's input and the
 * layers outside blocks; a block's own activations live in one block's
 * storage, its forward runs again just before its backward.  ALL: the
 * first block's input and the layers outside blocks; the block
 * boundaries take turns in two buffers, and before block b's backward
 * blocks 0..b run again from the first block's input (b + 1 block
 * forwards).  The numbers are the same in every mode. */
typedef enum st_recompute {
    ST_RECOMPUTE_NONE, ST_RECOMPUTE_BLOCKS, ST_RECOMPUTE_ALL
} st_recompute;

/* What a layer does in its own pass over its output (fused, the default)
 * and st_model_config.unfuse can move into a pass of its own, so that
 * each fusion can be measured alone (bench_step --unfuse, subtrain
 * --unfuse; the numbers are in doc/benchmarks.md).  Layers with a branch
 * scale keep their bias and skip fusions.  Each fusion but the bias and
 * the GELU backward gives results bitwise those of its separate pass; the
 * bias, the matmul's own argument, is rounded in oneDNN's order (equal to
 * about 1 ulp), the GELU backward below. */
enum {
    ST_UNFUSE_BIAS = 1,       /* y += b: a binary add after the product */
    ST_UNFUSE_RESIDUAL = 2,   /* y += the skip: a binary add after the product */
    ST_UNFUSE_WEIGHT_COPY = 4, /* bf16: the weights' copies made by a reorder in
                                * each forward, not written by the update
                                * (st_model_copies lists none) */
    ST_UNFUSE_RELU = 8,       /* a ReLU after a linear layer: an eltwise pass of
                               * its own, not the matmul's post-op */
    ST_UNFUSE_BN_RELU = 16,   /* a ReLU after a batch norm: an eltwise pass of
                               * its own, not the norm's fuse_norm_relu */
    ST_UNFUSE_RELU_BACKWARD = 32, /* a fused ReLU's backward (an mlp's but under
                               * recompute, resmlp's, gpt's): an eltwise pass of
                               * its own, not a mask post-op of the next layer's
                               * backward-data product */
    ST_UNFUSE_GELU_BACKWARD = 64, /* --activation-precision bf16: a GELU's
                               * backward (resmlp's, gpt's, vit's) as oneDNN's
                               * bf16 eltwise pass, not a multiply by gelu'(x)
                               * in the next layer's backward-data product;
                               * not bitwise: the fold rounds once, not twice */
};

/* --unfuse's value: a comma list of the fusions' names, "bias",
 * "residual", "weight-copy", "relu", "bn-relu", "relu-backward",
 * "gelu-backward", or "none",
 * into ST_UNFUSE_*
 * bits; ST_ERR_INVALID with "unknown fusion 'x' (allowed: ...)". */
st_status st_unfuse_parse(const char *list, unsigned *bits);
/* The bits as that list ("relu,bn-relu"; "none" for 0), like snprintf. */
size_t st_unfuse_describe(unsigned bits, char *buf, size_t n);

/* Which units an instance holds: a subnetwork of the model.  Units are
 * what the model's layers declare (st_model_config_units), whatever the
 * model: layer groups (residual blocks) and width units (groups of a
 * width layer's neurons).  All zero: the whole model.  Parameter names,
 * initial values and full-layout ranges always follow the full model. */
typedef struct st_model_subnet {
    /* Layer groups held (forward masking): n_groups ids, strictly
     * increasing in [0, groups of the model); the others are the
     * identity.  NULL: every group. */
    const int *groups;
    int n_groups;
    /* Backward masking of groups: group_grads[g] says whether group g's
     * weight gradients are computed and stored (data gradients flow
     * through every group).  The gradient vector then holds only those
     * groups (and what is in no group).  NULL: every group. */
    const uint8_t *group_grads;
    /* Width units: width layer u keeps width_count[u] >= 1 units of
     * unit_size consecutive neurons (the last unit may be smaller), listed
     * in increasing order in width_kept (layer after layer).  NULL: every
     * neuron.
     *   width_grads_only = 0 (forward masking): the compact subnetwork of
     *     the kept neurons — their rows of the producing matrix, the
     *     matching input slice of the consuming one;
     *   width_grads_only = 1 (backward masking): the full model, with
     *     weight gradients stored for the kept neurons (an image's: the
     *     kept channels) only; a linear layer computes only those, a
     *     convolution and a batch norm compute all and keep those. */
    int unit_size;
    const int *width_count;
    const int *width_kept;
    int width_grads_only;
    /* Forward masking: the product of each group's closing layer, and of
     * every layer reading a subset of a width layer, is multiplied by
     * scale (0 or 1: none); a group's bias too, a width subnetwork's bias
     * not (every worker holds it).  Subnetworks use the inverse coverage
     * in training so that a unit's expected contribution matches the full
     * model's. */
    float scale;
} st_model_subnet;

typedef struct st_model_config {
    st_model_kind kind;
    int depth;              /* hidden layers (mlp) or residual blocks (resmlp)
                             * of the full model */
    int width;              /* hidden width (mlp), residual stream width (resmlp) */
    int hidden;             /* inner width of a residual block; 0 means width */
    st_activation activation;
    int in_dim;             /* features per sample */
    /* Image inputs (convolutional models): in_dim = channels x height x
     * width, NCHW.  0: a vector of in_dim features (1 x 1 x in_dim). */
    int in_channels, in_height, in_width;
    int n_classes;
    /* Sequence models (gpt): tokens per sample (0: not a sequence model)
     * and attention heads (width = heads x head size). */
    int context;
    int heads;
    /* Patch models (vit): the side P of its square patches (0: none) and
     * what the head reads. */
    int patch;
    st_token_pool pool;
    st_model_subnet subnet; /* zero: the whole model */
    st_precision precision; /* of the products of linear, convolution and
                             * attention layers (FP32 default) */
    st_precision activations; /* with precision BF16: of the tensors between
                             * layers.  FP32 (default): layers write fp32 and
                             * each product converts what it reads.  BF16:
                             * layers write bf16 where their consumers read it,
                             * norms and softmax keep fp32 statistics inside
                             * (doc/precision.md) */
    unsigned unfuse;        /* ST_UNFUSE_* bits: fusions turned off, for
                             * measuring them (0: every fusion, the default) */
    int plain_tensors;      /* 1: image tensors stay NCHW between layers, each
                             * convolution and batch norm reorders into its
                             * blocked layout and back (for comparison; 0, the
                             * default, keeps them blocked: doc/cnn.md) */
    st_tensor_layout tensor_layout; /* without plain_tensors: AUTO (default),
                             * BLOCKED or NHWC */
    st_weight_layout weight_layout; /* with precision BF16: PLAIN (default) or
                             * BLOCKED */
    st_recompute recompute; /* what the forward keeps (NONE default) */
} st_model_config;

/* resmlp, depth 4, width 256, hidden = width, GELU, 784 inputs, 10 classes. */
st_model_config st_model_config_default(void);
/* Range checks with a message naming the field and what is allowed. */
st_status st_model_config_check(const st_model_config *cfg);

/* Units of unit_size neurons in the first width layer of the full model
 * (the units of --subnet neuron; 0 if the model has no width layer). */
int st_model_neuron_groups(const st_model_config *cfg, int unit_size);

/* The subnetwork units a model offers, as its layers declare them (see
 * doc/design.md): strategies ask this, never the model's kind.
 *   groups        layer groups: residual blocks, each dropped as the
 *                 identity (0: the model has none; --subnet block needs them)
 *   width_layers  width layers: a layer's output neurons whose groups of
 *                 unit_size are units, with the matching input slice of
 *                 their consumer (mlp: each hidden layer; resmlp: each
 *                 block's inner layer)
 *   width         neurons of the first width layer
 *   chained       1: some layer reads one width layer and writes another
 *                 (mlp's hidden-to-hidden matrices), so with disjoint
 *                 parts some of its weights are held by nobody */
typedef struct st_model_units {
    int groups;
    int width_layers;
    int width;
    int chained;
    int sections;   /* runs of groups in one section (a ResNet's stages that
                     * have groups; 1 for resmlp; 0: no groups) */
    int state;      /* floats of untrained state the full model keeps (batch
                     * norms' running statistics); 0: none */
} st_model_units;

st_status st_model_config_units(const st_model_config *cfg, st_model_units *out);

/* Units of unit_size neurons (channels) of each width layer, in order (at
 * most cap counts); returns the number of width layers.  A ResNet's
 * differ by stage. */
int st_model_config_width_groups(const st_model_config *cfg, int unit_size, int *groups,
                                 int cap);

/* The layer groups per section, in order (at most cap sizes); returns
 * the number of sections (st_model_units.sections). */
int st_model_config_sections(const st_model_config *cfg, int *sizes, int cap);

/* The full-layout ranges of the weights of layers that read one width
 * layer and write another (at most cap, sorted): where an element may be
 * held by nobody.  Returns their number (0 when the model has none). */
int st_model_config_chained_ranges(const st_model_config *cfg, st_range *out, int cap);

/* Parameters of a model with this configuration (no model is built). */
size_t st_model_config_param_count(const st_model_config *cfg);

/* The model kinds are one table (nn/model_kinds.c), each entry defined by its
 * file of src/nn/models/: how many there are, and the i-th in the order
 * --help and messages list them, i in [0, count) (-1 for another i). */
int st_model_kind_count(void);
st_model_kind st_model_kind_at(int i);
/* The kind of that name ("mlp", "gpt", ...); -1 when none has it (no
 * error is set: parsing a user's word is st_model_kind_parse's). */
st_model_kind st_model_kind_named(const char *name);
/* "unknown" for a value no entry has. */
const char *st_model_kind_name(st_model_kind kind);
/* What --help says of the kind after the list of names ("resnet:
 * pre-activation ResNet of 3 stages ..."); NULL when nothing. */
const char *st_model_kind_help(st_model_kind kind);
st_model_reads st_model_kind_reads(st_model_kind kind);
/* Whether the kind takes a model option (ST_MODEL_OPT_*): --hidden,
 * --context, --heads only some; --depth all but resnet18 (whose depth is
 * fixed: a front end accepts and ignores it, as --width and --activation
 * are accepted by every kind). */
int st_model_kind_takes(st_model_kind kind, unsigned option);
/* The names of the kinds that read `reads` (an st_model_reads; -1: every
 * kind), in table order, joined by sep: "mlp|resmlp|resnet|resnet18|gpt".
 * Like snprintf, returns the length the whole list needs. */
size_t st_model_kind_list(char *buf, size_t n, const char *sep, int reads);
/* A configuration as a front end gives it: the kind's defaults of the
 * options not given (the ST_MODEL_OPT_* bits of `given`; resnet: --depth
 * 3 --width 16 relu; gpt: --context 128 --heads 4, a byte id per token,
 * 256 classes), then its checks of those given, in the front end's words:
 * ST_ERR_INVALID with "--hidden applies to resmlp only (...)", "--context
 * applies to --model gpt only", "--heads 3 does not divide --width 256". */
st_status st_model_config_resolve(st_model_config *cfg, unsigned given);
/* The model in a run's banner, its kind's words: "resmlp depth 4 width
 * 256 hidden 256", "gpt depth 4 width 256 heads 4 context 128 hidden
 * 1024".  Like snprintf, returns the length the whole text needs. */
size_t st_model_config_describe(const st_model_config *cfg, char *buf, size_t n);

const char *st_activation_name(st_activation act);
const char *st_precision_name(st_precision p);
st_status st_precision_parse(const char *name, st_precision *out);
/* "auto", "blocked", "nhwc". */
const char *st_tensor_layout_name(st_tensor_layout l);
st_status st_tensor_layout_parse(const char *name, st_tensor_layout *out);
/* AUTO resolved for a model of precision p on this CPU (BLOCKED or NHWC);
 * another layout as it is. */
st_tensor_layout st_tensor_layout_resolve(st_tensor_layout l, st_precision p);
/* "plain", "blocked". */
const char *st_weight_layout_name(st_weight_layout l);
st_status st_weight_layout_parse(const char *name, st_weight_layout *out);
const char *st_token_pool_name(st_token_pool p);
st_status st_token_pool_parse(const char *name, st_token_pool *out);
const char *st_recompute_name(st_recompute r);
st_status st_recompute_parse(const char *name, st_recompute *out);

/* Whether this CPU runs bf16 products natively.  oneDNN's effective ISA
 * (which ONEDNN_MAX_CPU_ISA can lower): NATIVE with avx512_core_bf16 or
 * AMX; EMULATED where oneDNN still has bf16 kernels but converts in
 * software (avx512_core: slower than fp32, doc/precision.md); UNAVAILABLE
 * where it has none (a bf16 matmul cannot be created, e.g. AVX2).  *isa
 * names the effective ISA ("avx2", "avx512_core", ...). */
typedef enum st_bf16_support {
    ST_BF16_NATIVE, ST_BF16_EMULATED, ST_BF16_UNAVAILABLE
} st_bf16_support;
st_bf16_support st_bf16_probe(const char **isa);
/* oneDNN's effective ISA, named as above ("avx512_core_amx", ...): what its
 * kernels run, after ONEDNN_MAX_CPU_ISA. */
const char *st_cpu_isa_name(void);
/* ST_OK, or ST_ERR_INVALID with "unknown model 'x' (allowed: mlp, resmlp,
 * ...)", every kind's name listed, and *out unchanged (see status.h). */
st_status st_model_kind_parse(const char *name, st_model_kind *out);
st_status st_activation_parse(const char *name, st_activation *out);

typedef struct st_model st_model;

st_status st_model_create(const st_model_config *cfg, int batch, st_arena *arena,
                          st_model **out);

/* Where a model's parameters live when they are not its own: a vector
 * that several instances of one full-layout model read (one copy per
 * NUMA domain for data-parallel workers, doc/reduction.md).  params holds
 * count floats (the model's st_model_param_count); bf16, NULL or count
 * values, holds the bf16 copies the products read (--precision bf16) at
 * the parameters' own offsets, so that they are shared too.
 * copies_master 1: the bf16 copies the model lists (st_model_copies) are
 * the weights they copy (a bf16 master): the layers never convert them,
 * and nothing reads or writes params under them (the caller may leave
 * that memory out).
 * blocked, NULL or a store (st_blocked_store_create): --weight-layout
 * blocked's copies (st_model_blocked_copies) live there, one set for every
 * model over this storage, and the layers never pack them: whoever writes
 * a parameter packs it into them too (an update with
 * st_optim_update_blocked), and st_model_params_changed packs them all. */
typedef struct st_blocked_store st_blocked_store;
typedef struct st_model_storage {
    float *params;
    uint16_t *bf16;
    size_t count;
    int copies_master;
    st_blocked_store *blocked;
} st_model_storage;

/* A store of blocked weight copies whose memory comes from arena (taken
 * while models are built; the arena outlives the store).  Models built at
 * once from several threads may share it. */
st_status st_blocked_store_create(st_arena *arena, st_blocked_store **out);
void st_blocked_store_destroy(st_blocked_store *s);

/* st_model_create over `storage`: the parameters are storage->params (not
 * initialised: the caller writes them, once for every instance).  With
 * storage->bf16 (and a model that lists its weight copies: not with
 * ST_UNFUSE_WEIGHT_COPY) the layers read their bf16 weights there and
 * never convert them: whoever writes a parameter writes its copy too (an
 * update with st_optim_update_copies, the engine's all-gather), and
 * st_model_params_changed converts the copies at once. */
st_status st_model_create_on(const st_model_config *cfg, int batch, st_arena *arena,
                             const st_model_storage *storage, st_model **out);
void st_model_destroy(st_model *m);

/* Linear layers: weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in));
 * layer norms: gamma 1, beta 0.  Each tensor draws from its own RNG stream,
 * so the result depends on the seed only. */
void st_model_init_params(st_model *m, uint64_t seed);

/* This model's parameters from the full model's flat vector `full` (its
 * part of it, wherever this subnetwork's segments sit there). */
st_status st_model_load_full_params(st_model *m, const float *full);

/* The initial values (st_model_init_params with this seed) of elements
 * [begin, end) of the full model of cfg, without building it: for a shard
 * owner whose elements no subnetwork holds at the start. */
st_status st_model_init_full_range(const st_model_config *cfg, uint64_t seed, size_t begin,
                                   size_t end, float *out);

/* The segments of the full model of cfg (subnetwork fields ignored), in a
 * malloc'd array the caller frees: what a shard owner's optimizer needs,
 * since its shard is in the full layout whatever its own subnetwork. */
st_status st_model_config_segments(const st_model_config *cfg, st_param_segment **out,
                                   int *count);

/* The pieces of the full model's state (st_model_units.state floats: the
 * batch norms' running statistics), in a malloc'd array the caller frees
 * (NULL, 0 when it has none): each named "<layer>.running_mean" or
 * "<layer>.running_var", offset and count in the full state vector (the
 * layout of st_model_config_state_init), rows = count, cols = 1. */
st_status st_model_config_state_segments(const st_model_config *cfg, st_param_segment **out,
                                         int *count);

const st_model_config *st_model_get_config(const st_model *m);
int st_model_batch(const st_model *m);
/* Rows of every tensor per sample: the context of a sequence model (a
 * row per token), else 1.  The labels are batch x this, and evaluation
 * counts loss and hits per row. */
int st_model_tokens(const st_model *m);
float *st_model_input(st_model *m);       /* (batch, in_dim): fill before a pass */
int32_t *st_model_labels(st_model *m);    /* (batch x tokens) */
const float *st_model_logits(const st_model *m); /* (batch x tokens, n_classes) */

float *st_model_params(st_model *m);
/* State kept but not trained (batch norms' running statistics), in one
 * flat vector of *count floats (NULL, 0 when the model has none): what a
 * strategy averages or copies between replicas, and what evaluation uses. */
float *st_model_state(st_model *m, size_t *count);
/* The state of the full model of cfg at the start (st_model_units.state
 * floats into out): the layout strategies average the state in. */
st_status st_model_config_state_init(const st_model_config *cfg, float *out);
/* Adds this model's state into the full layout: sum[f] += its element f,
 * count[f] += 1, for each full element f it keeps (a subnetwork keeps the
 * state of the units it holds). */
void st_model_state_accumulate(const st_model *m, double *sum, uint32_t *count);
/* This model's state from a full-layout state vector. */
void st_model_state_load(st_model *m, const float *full);
/* The gradient vector: the parameter vector's layout, unless group_grads
 * leaves groups out (then segments' grad_offset say where each sits). */
float *st_model_grads(st_model *m);
size_t st_model_param_count(const st_model *m);
size_t st_model_grad_count(const st_model *m);
const st_param_segment *st_model_segments(const st_model *m, int *count);
/* bf16 (--precision bf16): the bf16 copies of weights that the products
 * read, increasing and disjoint, for st_optim_update_copies (NULL, 0 in
 * fp32).  Whoever writes the parameters and these copies together (an
 * owner that updates its own vector with them; an engine's all-gather,
 * st_comm_set_param_copies) calls st_model_copies_written after that
 * write, and the next training forward does not convert those weights
 * again.  The promise holds only if nothing else writes the parameters in
 * between (a round's write-back, a load): such writers do not call it,
 * and the layers convert as before. */
const st_param_copy *st_model_copies(const st_model *m, int *count);
void st_model_copies_written(st_model *m);
/* --weight-layout blocked: the weights' blocked bf16 copies, increasing
 * and disjoint (none of them in st_model_copies), for
 * st_optim_update_blocked.  An owner updating its own vector writes them,
 * and then calls st_model_copies_current; an engine's all-gather that
 * packs them as it writes the parameters (st_comm_set_param_blocked)
 * calls st_model_blocked_written after st_model_copies_written.  After
 * any other writer of the parameters (st_model_copies_written alone,
 * st_model_params_changed) the layers pack them in the next forward.
 * Copies in a store (st_model_storage.blocked) are the writers' to keep
 * current, always. */
const st_param_blocked *st_model_blocked_copies(const st_model *m, int *count);
void st_model_blocked_written(st_model *m);
/* Every copy, plain or blocked, holds the weights: the caller's update
 * wrote them all (st_optim_update_blocked), or nothing wrote the weights
 * since the training forward that made the copies (the micro-batches of
 * one step, --accumulate). */
void st_model_copies_current(st_model *m);
/* Takes that promise back: whoever writes the parameters of a model that
 * an update just wrote (st_trainer_model's, between st_trainer_step
 * calls, say) calls this, and the next forward converts the weights.  A
 * model whose copies are in shared storage (st_model_create_on) converts
 * them here instead, from the one thread that calls it. */
void st_model_params_changed(st_model *m);

/* One forward and backward pass over the whole batch: *loss is the mean
 * cross-entropy (over every row: a sequence model's tokens), the gradient vector is overwritten with dloss/dparams. */
st_status st_model_forward_backward(st_model *m, float *loss);

/* The same, telling ready(ctx, from) as the backward goes, after each
 * layer that completes more of it, that the gradient vector's elements
 * [from, st_model_grad_count) are final for this pass (nothing writes
 * them again until the next one): from only decreases, and is 0 last.
 * For a caller that reduces the gradients during the backward. */
st_status st_model_forward_backward_ready(st_model *m, float *loss,
                                          void (*ready)(void *ctx, size_t from), void *ctx);

/* Batch statistics recalibration: a training forward on the batch in the
 * input (nothing else: no loss, no gradient), whose batch norms update
 * their running statistics with momentum 1 / (k + 1).  Called for k = 0,
 * 1, ..., K - 1 on K batches, it sets them to the plain mean over the K
 * batches' statistics.  For a model whose weights were trained in other
 * compositions (subnetworks), whose running statistics do not describe it. */
st_status st_model_calibrate(st_model *m, int k);

/* Forward only, for evaluation: the first `rows` rows of the input are real
 * samples (the rest is padding).  Adds their summed loss and their number of
 * correct predictions to *loss_sum and *correct (per token for a sequence
 * model: rows x tokens of each). */
st_status st_model_evaluate(st_model *m, int rows, double *loss_sum, int64_t *correct);

/* Text from a gpt model built for batch 1 (256 classes): n bytes into out,
 * each the next byte after the prompt and the bytes before it.  The model
 * reads the last `context` of them (an empty prompt: a newline); byte by
 * byte, the logits of the last position keep their top_k largest (0: all
 * 256; ties go to the lower byte), are divided by the temperature and
 * softmaxed, and one byte is drawn.  Temperature 0 or top_k 1: the most
 * likely byte (greedy).  The output is a pure function of (parameters,
 * prompt, temperature, top_k, seed); a shorter n gives a prefix.  Each
 * byte runs the whole context's forward (no key/value cache): meant for
 * a few hundred bytes.  Overwrites the model's input and logits. */
st_status st_model_generate(st_model *m, const uint8_t *prompt, size_t prompt_len, size_t n,
                            float temperature, int top_k, uint64_t seed, uint8_t *out);

/* Where this model's parameters sit in the full model's flat vector: at
 * most `cap` ranges, sorted; range i starts at element local[i] of this
 * model's vector.  Returns the number of ranges (a whole model: one), or -1
 * if there are more than cap.  ranges NULL: just counts them. */
int st_model_full_ranges(const st_model *m, st_range *ranges, size_t *local, int cap);

/* The same for the gradient vector. */
int st_model_full_grad_ranges(const st_model *m, st_range *ranges, size_t *local, int cap);

/* Parameters of the full model this one is part of (itself if whole). */
size_t st_model_full_param_count(const st_model *m);

/* Matrix-multiply FLOPs of one forward_backward (2 per multiply-add): the
 * three products of each linear layer (two for the first, which needs no
 * input gradient).  The bias gradient, a B x out matrix-vector product, is
 * not counted: it is O(1/in) of the layer's work.  With recomputation,
 * plus the forwards the backward runs again, each a third of its layer's. */
double st_model_step_flops(const st_model *m);

/* One kind of work of a training step (st_model_step_costs): `count`
 * matrix products (m x k) x (k x n), each one primitive execution; or
 * `count` convolutions of one layer's pass, `flops` in all; or an
 * element-wise pass of operation `op` over `elements` values, `bytes`
 * read and written, in `calls` primitive executions or loops. */
typedef enum st_cost_kind { ST_COST_MATMUL, ST_COST_CONV, ST_COST_PASS } st_cost_kind;
/* A pass's operation: MEMORY moves or adds values (its time is its
 * bytes'); the others compute per value as the oneDNN primitive of that
 * name does. */
typedef enum st_cost_op {
    ST_OP_MEMORY, ST_OP_RELU, ST_OP_GELU, ST_OP_LAYERNORM, ST_OP_SOFTMAX, ST_OP_LOGSOFTMAX,
    ST_OP_BATCHNORM, ST_OP_COUNT
} st_cost_op;
/* How a product reads its operands: both as stored (row-major), B
 * transposed (a weight stored (out, in) in a forward), A transposed (the
 * weight gradient's dy^T x). */
typedef enum st_cost_operands {
    ST_OPERANDS_NN, ST_OPERANDS_NT, ST_OPERANDS_TN, ST_OPERANDS_COUNT
} st_cost_operands;
typedef struct st_step_cost {
    st_cost_kind kind;
    int bf16;                 /* products with bf16 operands */
    st_cost_operands operands;  /* how a product reads them */
    int heads;                /* attention's: every sample's and head's product
                               * in one execution over strided views (m: all
                               * their rows) */
    int64_t m, n, k;          /* matmul: its shape; conv: the product it
                               * amounts to (m: batch x output pixels, k:
                               * in channels x kernel, n: out channels) */
    double count;             /* products, or convolution passes */
    double flops;             /* of all `count` (2 per multiply-add) */
    st_cost_op op;            /* a pass's operation */
    int backward;             /* a pass of the backward */
    double elements;          /* a pass's values, all calls */
    double bytes;             /* a pass's bytes read and written, all calls */
    double calls;             /* primitive executions or loops */
} st_step_cost;

/* The work of one forward_backward, layer by layer, from the layers the
 * model built: each linear layer's and attention's products with their
 * own shapes, each convolution's passes, and the element-wise passes of
 * every layer (activations, norms, residual adds, softmax, bf16 copies,
 * bias gradients) and of the loss.  With recomputation, plus the forwards
 * run again.  The products' and convolutions' flops sum to
 * st_model_step_flops.  Writes up to cap entries; returns how many there
 * are (call with cap 0 to count). */
int st_model_step_costs(const st_model *m, st_step_cost *out, int cap);
/* Room for the distinct entries of every model kind's step at its
 * options' usual ranges (st_worker_size.costs). */
#define ST_STEP_COSTS_MAX 96

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_MODEL_H */
