/*
 * tests/test_export.c — `subtrain export` and the torch layout
 * (doc/interop.md), without PyTorch: the layout as the files show it,
 * round trips, eval of an exported file, and every refusal in one line.
 * tests/torch_interop.sh runs the same files through PyTorch.
 */
#include <math.h>

#include <criterion/criterion.h>

#include <subtrain/subtrain.h>

#include "cli_run.h"

/* A resmlp of 8 x 8 images (write_images) as 64 features. */
static void resmlp(char *out, size_t n, const char *dir)
{
    snprintf(out, n, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --model resmlp --depth 2 "
             "--width 16 --hidden 24", dir);
}

static void write_images(const char *dir);

/* A run of `args` that must succeed. */
static void ok_run(const char *args)
{
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "'%s' exited %d: %s", args, r->status, r->err);
    free(r);
}

/* A model trained 2 steps, its weights in dir/ck/final.safetensors. */
static void train(const char *dir, const char *model)
{
    char args[4 * ST_TEST_PATH_MAX];
    snprintf(args, sizeof args, "%s --steps 2 --batch 16 --progress none -q --checkpoint '%s/ck'",
             model, dir);
    ok_run(args);
}

/* A model trained 2 steps in a new directory: its options, its weights
 * (src), where their torch export goes (tor) and one more file (other).
 * `convnet`: "--model convnet" and its options after the data, else the
 * resmlp. */
typedef struct trained_run {
    char dir[ST_TEST_PATH_MAX], model[2 * ST_TEST_PATH_MAX];
    char src[ST_TEST_PATH_MAX + 32], tor[ST_TEST_PATH_MAX + 32], other[ST_TEST_PATH_MAX + 32];
} trained_run;

static void trained(trained_run *r, const char *convnet, const char *other)
{
    cr_assert_eq(st_test_mkdtemp(r->dir), 0);
    write_images(r->dir);
    if (convnet)
        snprintf(r->model, sizeof r->model, "--data 'idx:%s:tr-img,tr-lab,te-img,te-lab' %s",
                 r->dir, convnet);
    else
        resmlp(r->model, sizeof r->model, r->dir);
    train(r->dir, r->model);
    snprintf(r->src, sizeof r->src, "%s/ck/final.safetensors", r->dir);
    snprintf(r->tor, sizeof r->tor, "%s/torch.safetensors", r->dir);
    snprintf(r->other, sizeof r->other, "%s/%s", r->dir, other);
}

static void read_file(const char *path, st_safetensors *f)
{
    cr_assert_eq(st_safetensors_read(path, f), ST_OK, "%s: %s", path, st_last_error());
}

static const st_safetensors_tensor *tensor(const st_safetensors *f, const char *name)
{
    const st_safetensors_tensor *t = st_safetensors_find(f, name);
    cr_assert_not_null(t, "no tensor '%s'", name);
    return t;
}

static float at(const st_safetensors_tensor *t, size_t k)
{
    float v;
    memcpy(&v, (const unsigned char *)t->data + 4 * k, 4);
    return v;
}

/* Every tensor of a in b, the same dtype, shape and bytes, and no more. */
static void same_tensors(const char *a_path, const char *b_path)
{
    st_safetensors a, b;
    read_file(a_path, &a);
    read_file(b_path, &b);
    cr_assert_eq(a.n, b.n, "%s: %d tensors, %s: %d", a_path, a.n, b_path, b.n);
    for (int i = 0; i < a.n; i++) {
        const st_safetensors_tensor *x = &a.tensors[i], *y = tensor(&b, x->name);
        cr_assert(x->dtype == y->dtype && x->ndims == y->ndims && x->bytes == y->bytes &&
                  memcmp(x->shape, y->shape, sizeof x->shape) == 0 &&
                  memcmp(x->data, y->data, x->bytes) == 0, "'%s' differs", x->name);
    }
    st_safetensors_free(&a);
    st_safetensors_free(&b);
}

/* The torch layout of a resmlp: names of the modules, fc2 (stored (in,
 * out)) transposed to (out, in), the rest as stored; subtrain -> torch ->
 * subtrain gives the same file, and both evaluate alike. */
Test(export, resmlp_layout_round_trip_and_eval, .timeout = 60)
{
    trained_run e;
    trained(&e, NULL, "back.safetensors");
    char args[6 * ST_TEST_PATH_MAX];
    const char *dir = e.dir, *RESMLP = e.model, *src = e.src, *tor = e.tor, *back = e.other;
    snprintf(args, sizeof args, "export %s --init '%s' -o '%s'", RESMLP, src, tor);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "(torch layout)"), "%s", r->out);
    snprintf(args, sizeof args, "export --format subtrain %s --init '%s' -o '%s' -q", RESMLP, tor,
             back);
    ok_run(args);
    cr_assert(same_file(src, back), "subtrain -> torch -> subtrain is not the same file");

    st_safetensors s, t;
    read_file(src, &s);
    read_file(tor, &t);
    cr_assert_str_eq(st_safetensors_meta(&t, "subtrain.layout"), "torch");
    cr_assert_str_eq(st_safetensors_meta(&t, "subtrain.model"), "resmlp");
    cr_assert_str_eq(st_safetensors_meta(&t, "subtrain.hidden"), "24");
    cr_assert_str_eq(st_safetensors_meta(&t, "subtrain.in_features"), "64");
    cr_assert_str_eq(st_safetensors_meta(&t, "subtrain.config"),
                     st_safetensors_meta(&s, "subtrain.config"));
    cr_assert_eq(s.n, t.n);
    const st_safetensors_tensor *fc2 = tensor(&s, "block1.fc2.weight");
    const st_safetensors_tensor *w = tensor(&t, "blocks.1.fc2.weight");
    cr_assert(fc2->ndims == 2 && fc2->shape[0] == 24 && fc2->shape[1] == 16);
    cr_assert(w->ndims == 2 && w->shape[0] == 16 && w->shape[1] == 24);
    for (int i = 0; i < 24; i++)
        for (int j = 0; j < 16; j++)
            cr_assert_eq(at(fc2, (size_t)i * 16 + j), at(w, (size_t)j * 24 + i));
    const st_safetensors_tensor *fc1 = tensor(&s, "block0.fc1.weight");
    const st_safetensors_tensor *v = tensor(&t, "blocks.0.fc1.weight");
    cr_assert(v->shape[0] == 24 && v->shape[1] == 16 && memcmp(fc1->data, v->data, v->bytes) == 0);
    const st_safetensors_tensor *g = tensor(&s, "final_ln.gamma"), *n = tensor(&t, "norm.weight");
    cr_assert(n->ndims == 1 && memcmp(g->data, n->data, n->bytes) == 0);
    st_safetensors_free(&s);
    st_safetensors_free(&t);

    /* eval and training read either layout alike */
    char a[16384];
    snprintf(args, sizeof args, "eval %s --init '%s'", RESMLP, src);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(a, sizeof a, "%s", strstr(r->out, ": test_acc"));
    snprintf(args, sizeof args, "eval %s --init '%s'", RESMLP, tor);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert_str_eq(strstr(r->out, ": test_acc"), a);
    snprintf(args, sizeof args, "%s --steps 1 --batch 16 -q --progress none --init '%s'", RESMLP,
             tor);
    ok_run(args);
    free(r);
    st_test_rmdir(dir);
}

/* 8 x 8 images of 4 classes in dir: tr-img, tr-lab, te-img, te-lab. */
static void write_images(const char *dir)
{
    write_idx_set(dir, 64, 32, 4, 13);
}

/* A convnet: weights OIHW, running statistics re-estimated on
 * --bn-calibration batches and written after each norm's parameters;
 * eval of the exported file (which uses them) gives what eval of the
 * source gives (which re-estimates them alike); back in subtrain's
 * layout, the weights only. */
Test(export, convnet_oihw_running_statistics_and_eval, .timeout = 60)
{
    trained_run e;
    trained(&e, "--model convnet --depth 2 --width 4", "back.safetensors");
    char args[6 * ST_TEST_PATH_MAX];
    const char *dir = e.dir, *model = e.model, *src = e.src, *tor = e.tor, *back = e.other;
    snprintf(args, sizeof args, "export %s --batch 16 --bn-calibration 3 --init '%s' -o '%s'",
             model, src, tor);
    run_result *r = calloc(1, sizeof *r);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "running statistics re-estimated: the mean of the batch statistics "
                             "of 3 training batches of 16"), "%s", r->out);
    st_safetensors s, t;
    read_file(src, &s);
    read_file(tor, &t);
    const st_safetensors_tensor *c = tensor(&s, "stage1.conv.weight");
    const st_safetensors_tensor *w = tensor(&t, "stages.1.conv.weight");
    cr_assert(c->ndims == 2 && c->shape[0] == 8 && c->shape[1] == 36);
    cr_assert(w->ndims == 4 && w->shape[0] == 8 && w->shape[1] == 4 && w->shape[2] == 3 &&
              w->shape[3] == 3 && memcmp(c->data, w->data, w->bytes) == 0);
    static const char *const order[] = { "stages.0.bn.weight", "stages.0.bn.bias",
                                         "stages.0.bn.running_mean", "stages.0.bn.running_var" };
    int k = 0;
    while (k < t.n && strcmp(t.tensors[k].name, order[0]) != 0)
        k++;
    for (int i = 0; i < 4; i++)
        cr_assert(k + i < t.n && strcmp(t.tensors[k + i].name, order[i]) == 0,
                  "'%s' is not where a state_dict has it", order[i]);
    const st_safetensors_tensor *var = tensor(&t, "stages.1.bn.running_var");
    int moved = 0;   /* re-estimated: not the initial 1 */
    for (int i = 0; i < 8; i++)
        moved += at(var, (size_t)i) != 1.0f && at(var, (size_t)i) > 0.0f;
    cr_assert_eq(moved, 8);
    cr_assert_eq(t.n, s.n + 4);
    st_safetensors_free(&s);
    st_safetensors_free(&t);

    char a[16384];
    snprintf(args, sizeof args, "eval %s --batch 16 --bn-calibration 3 --init '%s'", model, src);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    snprintf(a, sizeof a, "%s", strstr(r->out, ": test_acc"));
    snprintf(args, sizeof args, "eval %s --batch 16 --bn-calibration 1 --init '%s'", model, tor);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert_str_eq(strstr(r->out, ": test_acc"), a, "the file's statistics are not used");

    snprintf(args, sizeof args, "export --format subtrain %s --init '%s' -o '%s'", model, tor,
             back);
    run(r, NULL, args);
    cr_assert_eq(r->status, 0, "%s", r->err);
    cr_assert(strstr(r->out, "weights only, no running statistics"), "%s", r->out);
    same_tensors(src, back);
    free(r);
    st_test_rmdir(dir);
}

Test(export, usage_errors)
{
    expect_usage_error("export --data synthetic --format onnx --init x -o y",
                       "--format: unknown value 'onnx' (allowed: torch, subtrain)");
    expect_usage_error("export --data synthetic --init x", "export needs -o FILE");
    expect_usage_error("export --data synthetic -o y", "export needs --init FILE");
    expect_usage_error("export --data synthetic --init x --output ''",
                       "--output: expected a file name, got ''");
    expect_usage_error("export --data synthetic --init x -o y --checkpoint d",
                       "export takes weights with --init and writes -o FILE only, not "
                       "--checkpoint");
    expect_usage_error("export --data synthetic --init x -o y --metrics m", "not --metrics");
    expect_usage_error("--data synthetic --steps 1 --format torch",
                       "--format applies to subtrain export only");
    expect_usage_error("--data synthetic --steps 1 -o y", "--output applies to subtrain export "
                       "only");
    expect_usage_error("eval --data synthetic --init x --output y",
                       "--output applies to subtrain export only");
}

Test(export, format_and_output_are_not_configuration_keys)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX + 16], args[2 * ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    static const char text[] = "output = y.safetensors\n";
    cr_assert_eq(st_test_write_file(st_test_path(path, dir, "c.conf"), text, sizeof text - 1), 0);
    snprintf(args, sizeof args, "export --data synthetic --init x -o y --config '%s'", path);
    expect_usage_error(args, "'output' is not a configuration key: give --output on the command "
                       "line");
    st_test_rmdir(dir);
}

/* A torch-layout file edited: out is `from` less tensor `drop` (NULL:
 * none), with `reshape` (NULL: none) given another shape of its elements,
 * and `add` (NULL: none) a copy of `drop`'s first tensor under that name. */
static void edit(const char *from, const char *out, const char *drop, const char *reshape,
                 const char *add)
{
    st_safetensors f;
    read_file(from, &f);
    st_safetensors_tensor *t = calloc((size_t)f.n + 1, sizeof *t);
    int n = 0;
    for (int i = 0; i < f.n; i++) {
        if (drop && strcmp(f.tensors[i].name, drop) == 0)
            continue;
        t[n] = f.tensors[i];
        if (reshape && strcmp(t[n].name, reshape) == 0) {   /* (a, b) as (b, a) */
            const int64_t a = t[n].shape[0];
            t[n].shape[0] = t[n].shape[1];
            t[n].shape[1] = a;
        }
        n++;
    }
    if (add) {
        t[n] = f.tensors[0];
        snprintf(t[n].name, sizeof t[n].name, "%s", add);
        n++;
    }
    cr_assert_eq(st_safetensors_write(out, t, n, f.meta, f.n_meta), ST_OK, "%s", st_last_error());
    free(t);
    st_safetensors_free(&f);
}

/* Files of another model, a tensor missing or of another shape, one the
 * model has not, running statistics in part: one line each, exit 1,
 * from export, eval and training alike. */
Test(export, another_models_file_is_refused, .timeout = 60)
{
    trained_run e;
    trained(&e, NULL, "bad.safetensors");
    char args[6 * ST_TEST_PATH_MAX];
    const char *dir = e.dir, *RESMLP = e.model, *src = e.src, *tor = e.tor, *bad = e.other;
    snprintf(args, sizeof args, "export %s --init '%s' -o '%s' -q", RESMLP, src, tor);
    ok_run(args);
    static const char *const cmds[] = { "export -o '%s/out.safetensors'", "eval",
                                        "--steps 1 --batch 16 -q --progress none" };
    /* each command reads the file its own way: every refusal through one,
     * the first two through all */
    for (int c = 0; c < 3; c++) {
        char cmd[2 * ST_TEST_PATH_MAX];
        snprintf(cmd, sizeof cmd, cmds[c], dir);
        snprintf(args, sizeof args, "%s --data 'idx:%s:tr-img,tr-lab,te-img,te-lab' --model mlp "
                 "--init '%s'", cmd, dir, tor);
        expect_runtime_error(NULL, args, "the weights of a resmlp model, not of mlp");
        edit(tor, bad, "blocks.0.fc1.weight", NULL, NULL);
        snprintf(args, sizeof args, "%s %s --init '%s'", cmd, RESMLP, bad);
        expect_runtime_error(NULL, args, "no tensor 'blocks.0.fc1.weight' (of shape [24, 16])");
    }
    snprintf(args, sizeof args, "eval %s --depth 3 --init '%s'", RESMLP, tor);
    expect_runtime_error(NULL, args, "its subtrain.depth is 2, the model's 3: the weights of "
                         "another model");
    snprintf(args, sizeof args, "eval %s --init '%s'", RESMLP, bad);
    edit(tor, bad, NULL, "blocks.1.fc2.weight", NULL);
    expect_runtime_error(NULL, args, "tensor 'blocks.1.fc2.weight' is not F32 of shape [16, 24] "
                         "as the model's");
    edit(tor, bad, NULL, NULL, "blocks.2.fc1.weight");
    expect_runtime_error(NULL, args, "tensor 'blocks.2.fc1.weight' is not in the model");
    snprintf(args, sizeof args, "export %s --init '%s/none' -o '%s'", RESMLP, dir, bad);
    expect_runtime_error(NULL, args, "none");
    st_test_rmdir(dir);
}

Test(export, running_statistics_come_whole, .timeout = 60)
{
    trained_run e;
    trained(&e, "--model convnet --depth 1 --width 4", "bad.safetensors");
    char args[6 * ST_TEST_PATH_MAX];
    const char *dir = e.dir, *model = e.model, *src = e.src, *tor = e.tor, *bad = e.other;
    snprintf(args, sizeof args, "export %s --init '%s' -o '%s' -q", model, src, tor);
    ok_run(args);
    edit(tor, bad, "stages.0.bn.running_var", NULL, NULL);
    snprintf(args, sizeof args, "eval %s --init '%s'", model, bad);
    expect_runtime_error(NULL, args, "running statistics in part: 'stages.0.bn.running_mean' is "
                         "there, 'stages.0.bn.running_var' is not");
    /* with none, eval re-estimates them as for a subtrain file */
    edit(tor, bad, "stages.0.bn.running_var", NULL, NULL);
    edit(bad, tor, "stages.0.bn.running_mean", NULL, NULL);
    snprintf(args, sizeof args, "eval %s --init '%s'", model, tor);
    ok_run(args);
    st_test_rmdir(dir);
}

/* The names: each family's torch names are the modules' of
 * python/subtrain_torch.py; a name the model lacks is refused. */
Test(export, torch_names)
{
    st_model_config c = st_model_config_default();
    char out[128];
    static const struct {
        const char *kind;
        const char *ours, *theirs;
    } names[] = {
        { "mlp", "fc1.weight", "hidden.1.weight" },
        { "resmlp", "block3.ln.gamma", "blocks.3.norm.weight" },
        { "resmlp", "final_ln.beta", "norm.bias" },
        { "gpt", "embed.token", "tok_emb.weight" },
        { "gpt", "block1.proj.weight", "blocks.1.attn.proj.weight" },
        { "gpt", "block1.fc2.bias", "blocks.1.mlp.fc2.bias" },
        { "gpt", "block0.ln2.gamma", "blocks.0.ln2.weight" },
        { "resnet", "stage2.block0.shortcut.weight", "stages.2.0.shortcut.weight" },
        { "resnet", "stage1.block1.bn0.running_var", "stages.1.1.bn0.running_var" },
        { "resnet18", "final_bn.gamma", "norm.weight" },
        { "convnet", "stage1.bn.running_mean", "stages.1.bn.running_mean" },
        { "convnet", "head.weight", "head.weight" },
        { "vit", "patch.weight", "patch_embed.weight" },
        { "vit", "tokens.position", "tokens.pos_emb" },
        { "vit", "block0.qkv.weight", "blocks.0.attn.qkv.weight" },
        { "vit", "final_ln.gamma", "norm.weight" },
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        c = st_model_config_default();
        c.kind = st_model_kind_named(names[i].kind);
        cr_assert_eq(st_model_config_resolve(&c, 0), ST_OK, "%s", st_last_error());
        if (c.kind != st_model_kind_named("gpt")) {   /* gpt: a byte id per token, 256 classes */
            c.in_dim = 64;
            c.n_classes = 4;
        }
        if (st_model_kind_reads(c.kind) == ST_MODEL_READS_IMAGES) {
            c.in_channels = 1;
            c.in_height = c.in_width = 8;
        }
        if (c.kind == st_model_kind_named("convnet"))
            c.depth = 2;
        cr_assert_eq(st_torch_name(&c, names[i].ours, out, sizeof out), ST_OK, "%s: %s",
                     names[i].ours, st_last_error());
        cr_assert_str_eq(out, names[i].theirs);
    }
    cr_assert_eq(st_torch_name(&c, "stage9.conv.weight", out, sizeof out), ST_ERR_INVALID);
}

/* A model of features reads in_features: a torch-layout mlp exported from
 * a run of synthetic data (784 features, no channels) evaluates on
 * Fashion-MNIST's 784 pixels of one channel; an image model's channels
 * are still checked (convnet_oihw_running_statistics_and_eval). */
Test(export, an_mlp_file_does_not_hold_its_data_channels, .timeout = 60)
{
    const char *data = getenv("SUBTRAIN_DATA") ? getenv("SUBTRAIN_DATA")
                                               : "/usr/share/datasets/fashion-mnist";
    char probe[ST_TEST_PATH_MAX + 64], dir[ST_TEST_PATH_MAX], args[6 * ST_TEST_PATH_MAX];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", data);
    if (access(probe, R_OK) != 0)
        cr_skip_test("no Fashion-MNIST at %s", data);
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    const char *mlp = "--model mlp --depth 2 --width 16";
    char model[128];
    snprintf(model, sizeof model, "--data synthetic %s", mlp);
    train(dir, model);
    snprintf(args, sizeof args, "export --data synthetic %s --init '%s/ck/final.safetensors' -o "
             "'%s/t.safetensors' -q", mlp, dir, dir);
    ok_run(args);
    snprintf(args, sizeof args, "eval --data '%s' %s --init '%s/t.safetensors'", data, mlp, dir);
    ok_run(args);
    st_test_rmdir(dir);
}
