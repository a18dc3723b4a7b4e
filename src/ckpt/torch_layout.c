/*
 * ckpt/torch_layout.c — a model's weights in PyTorch's layout
 * (subtrain/torch_layout.h, doc/interop.md).
 *
 * The names are subtrain's rewritten by a table of rules per model kind
 * (the reference modules of python/subtrain_torch.py hold their layers in
 * ModuleLists: "block3." becomes "blocks.3."), then a norm's gamma and
 * beta become its weight and bias.  A layout is a plan: one entry per
 * tensor of the file, in the order the file lists them (each batch
 * norm's running statistics after its parameters, as a state_dict has
 * them), with where its elements sit in the flat vectors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <subtrain/torch_layout.h>
#include <subtrain/version.h>

#include "core/error.h"

/* ------------------------------------------------------------ names */

/* Whether model `kind` is one of `names` (words separated by spaces;
 * NULL: every model). */
static int kind_in(st_model_kind kind, const char *names)
{
    if (!names)
        return 1;
    const char *name = st_model_kind_name(kind);
    const size_t len = strlen(name);
    for (const char *p = names; (p = strstr(p, name)) != NULL; p += len)
        if ((p == names || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\0'))
            return 1;
    return 0;
}

#define CONVS "resnet resnet18 convnet"

/* A rule: subtrain's pattern and torch's, '#' a run of digits (the same
 * ones in turn), '*' the rest of the name (last). */
static const struct rule {
    const char *kinds;   /* the models it applies to (kind_in); NULL: all */
    const char *from, *to;
} rules[] = {
    { "mlp", "fc#.*", "hidden.#.*" },
    { "resmlp", "block#.ln.*", "blocks.#.norm.*" },
    { "gpt", "embed.token", "tok_emb.weight" },
    { "gpt", "embed.position", "pos_emb.weight" },
    { "vit", "patch.*", "patch_embed.*" },
    { "vit", "tokens.class", "tokens.cls_token" },
    { "vit", "tokens.position", "tokens.pos_emb" },
    { "gpt vit", "block#.qkv.*", "blocks.#.attn.qkv.*" },
    { "gpt vit", "block#.proj.*", "blocks.#.attn.proj.*" },
    { "gpt vit", "block#.fc1.*", "blocks.#.mlp.fc1.*" },
    { "gpt vit", "block#.fc2.*", "blocks.#.mlp.fc2.*" },
    { "resmlp gpt vit", "block#.*", "blocks.#.*" },
    { "resmlp gpt vit", "final_ln.*", "norm.*" },
    { "resnet resnet18", "stage#.block#.*", "stages.#.#.*" },
    { "resnet resnet18", "final_bn.*", "norm.*" },
    { "convnet", "stage#.*", "stages.#.*" },
    { NULL, "*", "*" },
};

/* Matches name against pattern; the captures (digit runs, then the
 * rest) go to caps as (start, length) pairs. */
static int match(const char *pat, const char *name, const char *caps[][2], int *n_caps)
{
    *n_caps = 0;
    for (; *pat; pat++) {
        if (*pat == '*') {
            caps[*n_caps][0] = name;
            caps[(*n_caps)++][1] = name + strlen(name);
            return 1;
        }
        if (*pat == '#') {
            const char *start = name;
            while (*name >= '0' && *name <= '9')
                name++;
            if (name == start)
                return 0;
            caps[*n_caps][0] = start;
            caps[(*n_caps)++][1] = name;
            continue;
        }
        if (*name++ != *pat)
            return 0;
    }
    return *name == '\0';
}

static st_status rename_(st_model_kind kind, const char *name, char *out, size_t n)
{
    const char *caps[8][2];
    int n_caps;
    for (size_t r = 0; r < sizeof rules / sizeof *rules; r++) {
        if (!kind_in(kind, rules[r].kinds) || !match(rules[r].from, name, caps, &n_caps))
            continue;
        size_t len = 0;
        int k = 0;
        for (const char *t = rules[r].to; *t && len < n; t++) {
            if (*t == '#' || *t == '*') {
                const size_t w = (size_t)(caps[k][1] - caps[k][0]);
                if (len + w >= n)
                    break;
                memcpy(out + len, caps[k][0], w);
                len += w;
                k++;
            } else {
                out[len++] = *t;
            }
        }
        if (len >= n)
            return st_fail(ST_ERR_INVALID, "torch layout: the name of '%s' is too long", name);
        out[len] = '\0';
        /* a norm's scale and shift are nn.LayerNorm's and nn.BatchNorm2d's
         * weight and bias */
        const size_t l = strlen(out);
        if (l > 6 && strcmp(out + l - 6, ".gamma") == 0 && l + 1 < n)
            strcpy(out + l - 6, ".weight");
        else if (l > 5 && strcmp(out + l - 5, ".beta") == 0)
            strcpy(out + l - 5, ".bias");
        return ST_OK;
    }
    return st_fail(ST_ERR_INVALID, "torch layout: no name for '%s'", name);
}

/* ------------------------------------------------------------ the plan */

typedef struct entry {
    char name[ST_SAFETENSORS_MAX_NAME];   /* torch's */
    const char *own;             /* subtrain's */
    size_t offset, count;        /* in the parameter or the state vector */
    long long rows, cols;        /* subtrain's storage shape */
    int transpose;               /* stored (in, out), torch's (out, in) */
    int state;                   /* a running statistic */
    int ndims;
    int64_t shape[ST_SAFETENSORS_MAX_DIMS];
} entry;

typedef struct plan {
    st_param_segment *segs, *states;
    int n_segs, n_states;
    entry *e;
    int n, n_params;             /* entries, of which parameters */
} plan;

static void plan_free(plan *p)
{
    free(p->segs);
    free(p->states);
    free(p->e);
    memset(p, 0, sizeof *p);
}

static int ends_with(const char *s, const char *tail)
{
    const size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

static st_status add_entry(plan *p, const st_model_config *cfg, const st_param_segment *g,
                           int state)
{
    entry *e = &p->e[p->n++];
    memset(e, 0, sizeof *e);
    ST_TRY(rename_(cfg->kind, g->name, e->name, sizeof e->name));
    e->own = g->name;
    e->offset = g->offset;
    e->count = g->count;
    e->rows = g->rows;
    e->cols = g->cols;
    e->state = state;
    e->transpose = g->in_major && g->cols > 1;
    /* convolutions: an (out, in x k x k) matrix whose columns run over
     * the input channels' k x k windows, OIHW; 3 x 3 but for the 1 x 1
     * projection shortcuts (models/resnet.c, models/convnet.c) */
    const int conv = kind_in(cfg->kind, CONVS) && g->cols > 1 && ends_with(g->name, ".weight") &&
                     strcmp(g->name, "head.weight") != 0;
    /* a ViT's patch map: Conv2d(C, D, P, stride P)'s (D, C, P, P) */
    const int patch = kind_in(cfg->kind, "vit") && strcmp(g->name, "patch.weight") == 0;
    if (conv || patch) {
        const long long k = patch ? cfg->patch : ends_with(g->name, ".shortcut.weight") ? 1 : 3;
        if (g->cols % (k * k))
            return st_fail(ST_ERR_INVALID, "torch layout: '%s' (%lld x %lld) is no %lldx%lld "
                           "convolution", g->name, g->rows, g->cols, k, k);
        e->ndims = 4;
        e->shape[0] = g->rows;
        e->shape[1] = g->cols / (k * k);
        e->shape[2] = e->shape[3] = k;
    } else if (g->cols == 1) {
        e->ndims = 1;
        e->shape[0] = g->rows;
    } else {
        e->ndims = 2;
        e->shape[0] = e->transpose ? g->cols : g->rows;
        e->shape[1] = e->transpose ? g->rows : g->cols;
    }
    return ST_OK;
}

/* The file's tensors in order: the parameters, each batch norm's
 * running statistics after its beta. */
static st_status plan_make(const st_model_config *cfg, plan *p)
{
    memset(p, 0, sizeof *p);
    ST_TRY(st_model_config_segments(cfg, &p->segs, &p->n_segs));
    st_status s = st_model_config_state_segments(cfg, &p->states, &p->n_states);
    if (s == ST_OK && !(p->e = calloc((size_t)(p->n_segs + p->n_states) + 1, sizeof *p->e)))
        s = st_fail(ST_ERR_NOMEM, "out of memory laying out a model for torch");
    int placed = 0;
    for (int i = 0; s == ST_OK && i < p->n_segs; i++) {
        s = add_entry(p, cfg, &p->segs[i], 0);
        p->n_params++;
        const size_t len = strlen(p->segs[i].name);
        if (s != ST_OK || !ends_with(p->segs[i].name, ".beta"))
            continue;
        for (int j = 0; s == ST_OK && j < p->n_states; j++)
            if (strncmp(p->states[j].name, p->segs[i].name, len - 4) == 0 &&
                strchr(p->states[j].name + len - 4, '.') == NULL) {
                s = add_entry(p, cfg, &p->states[j], 1);
                placed++;
            }
    }
    if (s == ST_OK && placed != p->n_states)
        s = st_fail(ST_ERR_INVALID, "torch layout: %d of the model's %d running statistics "
                    "follow no norm", p->n_states - placed, p->n_states);
    if (s != ST_OK)
        plan_free(p);
    return s;
}

static const entry *plan_find(const plan *p, const char *torch_name)
{
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->e[i].name, torch_name) == 0)
            return &p->e[i];
    return NULL;
}

static void shape_text(const entry *e, char *out, size_t n)
{
    size_t len = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < e->ndims && len < n; d++)
        len += (size_t)snprintf(out + len, n - len, "%s%lld", d ? ", " : "",
                                (long long)e->shape[d]);
    if (len < n)
        snprintf(out + len, n - len, "]");
}

st_status st_torch_name(const st_model_config *cfg, const char *name, char *out, size_t n)
{
    plan p;
    ST_TRY(plan_make(cfg, &p));
    st_status s = st_fail(ST_ERR_INVALID, "torch layout: the model has no '%s'", name);
    for (int i = 0; i < p.n; i++)
        if (strcmp(p.e[i].own, name) == 0) {
            s = (size_t)snprintf(out, n, "%s", p.e[i].name) < n
                    ? ST_OK
                    : st_fail(ST_ERR_INVALID, "torch layout: the name of '%s' is too long", name);
            break;
        }
    plan_free(&p);
    return s;
}

st_status st_torch_layout_detect(const st_safetensors *f, const st_model_config *cfg,
                                 int *torch)
{
    *torch = 0;
    const char *layout = st_safetensors_meta(f, ST_TORCH_LAYOUT_KEY);
    if (layout) {
        *torch = strcmp(layout, "torch") == 0;
        return ST_OK;
    }
    plan p;
    ST_TRY(plan_make(cfg, &p));
    for (int j = 0; j < f->n && !*torch; j++) {
        int theirs = plan_find(&p, f->tensors[j].name) != NULL, ours = 0;
        for (int i = 0; theirs && !ours && i < p.n; i++)
            ours = strcmp(p.e[i].own, f->tensors[j].name) == 0;
        *torch = theirs && !ours;
    }
    plan_free(&p);
    return ST_OK;
}

/* ------------------------------------------------------------ metadata */

/* The inner width the model has: resmlp's blocks, gpt's MLP (0: none). */
static int inner_width(const st_model_config *c)
{
    if (kind_in(c->kind, "resmlp"))
        return c->hidden > 0 ? c->hidden : c->width;
    if (kind_in(c->kind, "gpt vit"))
        return c->hidden > 0 ? c->hidden : 4 * c->width;
    return 0;
}

/* The model's words in the metadata: key, value as an integer (or the
 * activation's or pooling's name), whether a file's value must be cfg's,
 * and whether the model has it (a ViT's patch and pooling: the others'
 * files do not say them). */
enum { N_MODEL_KEYS = 13 };
typedef struct model_key {
    const char *key;
    int value;
    int checked;
    int present;
} model_key;

/* The value of key k as the metadata writes it. */
static void key_text(const model_key *k, char *out, size_t n)
{
    if (strcmp(k->key, "subtrain.activation") == 0)
        snprintf(out, n, "%s", st_activation_name((st_activation)k->value));
    else if (strcmp(k->key, "subtrain.pool") == 0)
        snprintf(out, n, "%s", st_token_pool_name((st_token_pool)k->value));
    else
        snprintf(out, n, "%d", k->value);
}

static void model_keys(const st_model_config *c, model_key k[N_MODEL_KEYS])
{
    const int r18 = kind_in(c->kind, "resnet18"), vit = kind_in(c->kind, "vit");
    /* a model of features (mlp, resmlp) reads in_features; its data's
     * channels, if any, change nothing */
    const int images = kind_in(c->kind, "resnet resnet18 convnet vit");
    const model_key all[N_MODEL_KEYS] = {
        { "subtrain.depth", r18 ? 2 : c->depth, !r18, 1 },   /* resnet18: 2 blocks a stage */
        { "subtrain.width", c->width, 1, 1 },
        { "subtrain.hidden", inner_width(c), 1, 1 },
        { "subtrain.heads", c->heads, 1, 1 },
        { "subtrain.context", c->context, 1, 1 },
        { "subtrain.activation", (int)c->activation, 1, 1 },
        { "subtrain.in_features", c->in_dim, 1, 1 },
        { "subtrain.in_channels", c->in_channels, images, 1 },
        /* the modules take any image size (a ViT's: with its positions' tokens) */
        { "subtrain.in_height", c->in_height, 0, 1 },
        { "subtrain.in_width", c->in_width, 0, 1 },
        { "subtrain.classes", c->n_classes, 1, 1 },
        { "subtrain.patch", c->patch, 1, vit },
        { "subtrain.pool", (int)c->pool, 1, vit },
    };
    memcpy(k, all, sizeof all);
}

static st_status check_meta(const st_safetensors *f, const char *path, const st_model_config *c)
{
    const char *kind = st_safetensors_meta(f, "subtrain.model");
    if (kind && strcmp(kind, st_model_kind_name(c->kind)) != 0)
        return st_fail(ST_ERR_FORMAT, "%s: the weights of a %s model, not of %s", path, kind,
                       st_model_kind_name(c->kind));
    model_key k[N_MODEL_KEYS];
    model_keys(c, k);
    for (int i = 0; i < N_MODEL_KEYS; i++) {
        const char *v = st_safetensors_meta(f, k[i].key);
        if (!v || !k[i].checked || !k[i].present)
            continue;
        char want[32];
        key_text(&k[i], want, sizeof want);
        if (strcmp(v, want) != 0)
            return st_fail(ST_ERR_FORMAT, "%s: its %s is %s, the model's %s: the weights of "
                           "another model", path, k[i].key, v, want);
    }
    return ST_OK;
}

/* ------------------------------------------------------------ writing */

st_status st_torch_write(const char *path, const st_model_config *cfg, const float *params,
                         const float *state, const st_safetensors_meta_entry *meta, int n_meta)
{
    plan p;
    ST_TRY(plan_make(cfg, &p));
    size_t moved = 0;   /* floats of the transposed copies */
    for (int i = 0; i < p.n; i++)
        moved += p.e[i].transpose ? p.e[i].count : 0;
    st_safetensors_tensor *t = calloc((size_t)p.n + 1, sizeof *t);
    st_safetensors_meta_entry *m = calloc((size_t)n_meta + N_MODEL_KEYS + 4, sizeof *m);
    float *copy = malloc((moved ? moved : 1) * sizeof *copy);
    char (*text)[32] = calloc(N_MODEL_KEYS, sizeof *text);
    st_status s = t && m && copy && text ? ST_OK
                                         : st_fail(ST_ERR_NOMEM, "out of memory writing %s", path);
    int n = 0;
    float *at = copy;
    for (int i = 0; s == ST_OK && i < p.n; i++) {
        const entry *e = &p.e[i];
        if (e->state && !state)
            continue;
        const float *src = (e->state ? state : params) + e->offset;
        st_safetensors_tensor *x = &t[n++];
        snprintf(x->name, sizeof x->name, "%s", e->name);
        x->dtype = ST_DTYPE_F32;
        x->ndims = e->ndims;
        memcpy(x->shape, e->shape, sizeof x->shape);
        x->data = src;
        if (e->transpose) {   /* (rows, cols) stored: element (r, c) to (c, r) */
            for (long long r = 0; r < e->rows; r++)
                for (long long c = 0; c < e->cols; c++)
                    at[c * e->rows + r] = src[r * e->cols + c];
            x->data = at;
            at += e->count;
        }
    }
    int k = 0;
    if (s == ST_OK) {
        for (int i = 0; i < n_meta; i++)
            m[k++] = meta[i];
        m[k++] = (st_safetensors_meta_entry){ "subtrain.version", SUBTRAIN_VERSION };
        m[k++] = (st_safetensors_meta_entry){ ST_TORCH_LAYOUT_KEY, "torch" };
        m[k++] = (st_safetensors_meta_entry){ "subtrain.model", st_model_kind_name(cfg->kind) };
        model_key keys[N_MODEL_KEYS];
        model_keys(cfg, keys);
        for (int i = 0; i < N_MODEL_KEYS; i++) {
            if (!keys[i].present)
                continue;
            key_text(&keys[i], text[i], sizeof text[i]);
            m[k++] = (st_safetensors_meta_entry){ keys[i].key, text[i] };
        }
        s = st_safetensors_write(path, t, n, m, k);
    }
    free(t);
    free(m);
    free(copy);
    free(text);
    plan_free(&p);
    return s;
}

/* ------------------------------------------------------------ reading */

/* The file's data may be unaligned: every float is copied bytewise. */
static void read_entry(const entry *e, const st_safetensors_tensor *x, float *dst)
{
    const unsigned char *src = x->data;
    if (!e->transpose) {
        memcpy(dst, src, e->count * sizeof *dst);
        return;
    }
    for (long long r = 0; r < e->rows; r++)   /* the file's (c, r) is our (r, c) */
        for (long long c = 0; c < e->cols; c++)
            memcpy(&dst[r * e->cols + c], src + (size_t)(c * e->rows + r) * sizeof *dst,
                   sizeof *dst);
}

static int same_shape(const entry *e, const st_safetensors_tensor *x)
{
    if (x->dtype != ST_DTYPE_F32 || x->ndims != e->ndims)
        return 0;
    for (int d = 0; d < e->ndims; d++)
        if (x->shape[d] != e->shape[d])
            return 0;
    return 1;
}

st_status st_torch_load(const st_safetensors *f, const char *path, const st_model_config *cfg,
                        float *params, float *state, int *has_state)
{
    if (has_state)
        *has_state = 0;
    ST_TRY(check_meta(f, path, cfg));
    plan p;
    ST_TRY(plan_make(cfg, &p));
    st_status s = ST_OK;
    char shape[96];
    /* every tensor of the file is one of the model's */
    for (int j = 0; s == ST_OK && j < f->n; j++)
        if (!plan_find(&p, f->tensors[j].name))
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is not in the model: the weights of "
                        "another model", path, f->tensors[j].name);
    const entry *stat_there = NULL, *stat_missing = NULL;
    for (int i = 0; s == ST_OK && i < p.n; i++) {
        const entry *e = &p.e[i];
        const st_safetensors_tensor *x = st_safetensors_find(f, e->name);
        shape_text(e, shape, sizeof shape);
        if (e->state) {
            if (!x) {
                stat_missing = stat_missing ? stat_missing : e;
                continue;
            }
            stat_there = stat_there ? stat_there : e;
        } else if (!x) {
            s = st_fail(ST_ERR_FORMAT, "%s: no tensor '%s' (of shape %s): the weights of "
                        "another model", path, e->name, shape);
            break;
        }
        if (!same_shape(e, x)) {
            s = st_fail(ST_ERR_FORMAT, "%s: tensor '%s' is not F32 of shape %s as the model's: "
                        "another model's weights", path, e->name, shape);
            break;
        }
        if (!e->state)
            read_entry(e, x, params + e->offset);
        else if (state)
            read_entry(e, x, state + e->offset);
    }
    if (s == ST_OK && stat_there && stat_missing)
        s = st_fail(ST_ERR_FORMAT, "%s: running statistics in part: '%s' is there, '%s' is not "
                    "(a file holds all of the model's or none)", path, stat_there->name,
                    stat_missing->name);
    if (s == ST_OK && has_state)
        *has_state = stat_there != NULL && state != NULL;
    plan_free(&p);
    return s;
}
