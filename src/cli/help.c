/* cli/help.c — `subtrain --help`: the strategies' and the models' parts
 * from their tables (subtrain/strategy.h, the library's model kinds). */
#include <stdio.h>
#include <string.h>

#include "cli/options.h"

/* An option's lines of --help: its text from column 25, after the
 * option where it leaves room (three spaces at least), else below it;
 * the text's lines joined by '\n'. */
static void print_option(FILE *f, const char *head, const char *text)
{
    const size_t len = strlen(head), first = strcspn(text, "\n");
    if (len < 25)
        fprintf(f, "%-25s", head);
    else if (len + 3 + first <= 80)
        fprintf(f, "%s   ", head);
    else
        fprintf(f, "%s\n%25s", head, "");
    for (const char *p = text; *p; p++)
        if (*p == '\n')
            fprintf(f, "\n%25s", "");
        else
            fputc(*p, f);
    fputc('\n', f);
}

/* --strategy, every strategy's part of its text, then every strategy's
 * options in the table's order (an option two strategies take shows under
 * each, with what it does there). */
static void print_strategies(FILE *f)
{
    char head[256] = "  --strategy ", text[4096] = "";
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++) {
        const st_strategy_info *info = st_strategy_info_of((st_strategy)s);
        snprintf(head + strlen(head), sizeof head - strlen(head), "%s%s", s ? "|" : "",
                 info->name);
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s", s ? "\n" : "",
                 info->help);
    }
    print_option(f, head, text);
    for (int s = 0; st_strategy_info_of((st_strategy)s); s++)
        for (const st_strategy_option *d = st_strategy_info_of((st_strategy)s)->options;
             d && d->name; d++) {
            snprintf(head, sizeof head, "  --%s%s%s", d->name, d->syntax[0] ? " " : "",
                     d->syntax);
            print_option(f, head, d->help);
        }
}

/* One paragraph of --help's option text: from column 25, words moved to
 * the next line past column 79. */
static void print_wrapped(FILE *f, const char *text)
{
    const int indent = 25, last = 79;
    int col = 0;
    for (const char *p = text; *p;) {
        const size_t len = strcspn(p, " ");
        if (col > indent && col + 1 + (int)len > last) {
            fputc('\n', f);
            col = 0;
        }
        if (col == 0)
            col = fprintf(f, "%*s", indent, "");
        else
            col += fprintf(f, " ");
        col += fprintf(f, "%.*s", (int)len, p);
        p += len;
        p += strspn(p, " ");
    }
    fputc('\n', f);
}

/* --model: the names and what each kind says of itself, from the library's
 * table of model kinds. */
static void print_model_help(FILE *f)
{
    char names[256], text[2048];
    st_model_kind_list(names, sizeof names, "|", -1);
    fprintf(f, "  --model %s\n", names);
    size_t len = (size_t)snprintf(text, sizeof text, "architecture (default %s)",
                                  st_model_kind_name(st_model_config_default().kind));
    for (int i = 0; i < st_model_kind_count() && len < sizeof text; i++) {
        const char *help = st_model_kind_help(st_model_kind_at(i));
        if (help)
            len += (size_t)snprintf(text + len, sizeof text - len, "; %s", help);
    }
    print_wrapped(f, text);
}

void st_cli_print_help(FILE *f)
{
    fputs(
"Usage: subtrain [train] [OPTION]...\n"
"       subtrain topo [--topology SPEC] [--workers N] [--oversubscribe] [--cpuset LIST]\n"
"       subtrain quad [--case all|1|2|3|4|5|6] [OPTION]... (IST theory on quadratics)\n"
"       subtrain plan --memory-per-worker SIZE [OPTION]...   (strategies that fit)\n"
"       subtrain calibrate [-o FILE]   (this machine's rates, for plan)\n"
"Train a neural network on one CPU server with oneDNN; `subtrain topo --help`\n"
"prints where the workers would run, `subtrain plan --help` which strategies\n"
"fit a memory budget and how fast each would run.\n"
"\n"
"Workers:\n", f);
    print_strategies(f);
    fputs(
"  --neuron-group G       neurons per neuron unit (default 16; gpt, vit: the head\n"
"                         size, a multiple of which it must be)\n"
"  --bn-calibration N     sdp (forward masking), ist: before each evaluation the\n"
"                         full model re-estimates its batch norm statistics on N\n"
"                         training batches (default 50; 0: the subnetworks'\n"
"                         averaged statistics)\n"
"  --workers N|cores      worker threads, each pinned to a core, its memory on its\n"
"                         NUMA node (default 1; cores: one per physical core)\n"
"  --oversubscribe        allow more workers than allowed PUs (with a warning)\n"
"  --threads-per-worker T each worker a team of T cores in one NUMA domain, its\n"
"                         oneDNN primitives running T threads (default 1)\n"
"  --team-spans-domains   allow a team across NUMA domains (refused otherwise)\n"
"  --comm-precision fp32|bf16   the gradients the reduction reads: bf16 halves\n"
"                         the bytes workers read of each other's gradients (sums,\n"
"                         masters, optimizer and all-gather fp32; dp, sdp, synth;\n"
"                         default fp32; doc/reduction.md)\n"
"  --weights shared|private   shared: the workers of a NUMA domain read one\n"
"                         weight copy, which the shard owners update (default,\n"
"                         where the strategy can: dp, sdp --masking backward,\n"
"                         synth's recovery); private: a replica per worker.\n"
"                         The same numbers either way\n"
"  --cpuset LIST          run on these OS CPU numbers only, e.g. 0-7,16 (default:\n"
"                         the process's allowed CPUs)\n"
"\n"
"Data:\n"
"  --data DIR|synthetic|cifar10:DIR|cifar100:DIR|idx:DIR[:TRI,TRL,TEI,TEL]|text:FILE\n"
"                         Fashion-MNIST IDX files in DIR (default: $SUBTRAIN_DATA,\n"
"                         else " ST_FASHION_MNIST_DIR "); a seeded\n"
"                         synthetic task generated in memory; CIFAR-10 or\n"
"                         CIFAR-100 binaries (the extracted cifar-10-batches-bin\n"
"                         or cifar-100-binary directory); or any IDX image set\n"
"                         (EMNIST, MNIST), its files named relative to DIR\n"
"                         (default: Fashion-MNIST's), classes from its labels; or\n"
"                         any file as bytes (gzip too) for --model gpt: training\n"
"                         reads seeded random windows of context + 1 bytes\n"
"  --augment-crop P       training images: pad P zero pixels on each side, crop\n"
"                         back at a random offset (default 0: off)\n"
"  --augment-flip         training images: mirror left-right with p = 0.5\n"
"  --split iid|classes:K|dirichlet:ALPHA   the training set over the workers:\n"
"                         one shuffle for all (default iid), K classes per\n"
"                         worker, or a Dirichlet(ALPHA) label skew, dealt from\n"
"                         --seed; each worker's batches come from its own split\n"
"                         (doc/noniid.md)\n"
"  --holdout F            text: the held-out fraction, the file's tail (default 0.1)\n"
"  --val-bytes N          text: evaluate on the first N held-out bytes (default\n"
"                         1048576; 0: all of them)\n"
"  --epoch-windows N      text: training windows per epoch (default: the training\n"
"                         bytes / context, about one pass)\n"
"Model:\n", f);
    print_model_help(f);
    fputs(
"  --depth N              hidden layers (mlp), residual blocks (resmlp) or blocks\n"
"                         per stage (resnet) (default 4; resnet 3)\n"
"  --width N              hidden / residual width, channels of a resnet's first\n"
"                         stage (default 256; resnet 16)\n"
"  --hidden N             inner width of a residual block (default: the width)\n"
"  --activation relu|gelu (default gelu; resnet relu)\n"
"  --precision fp32|bf16  linear, conv and attention products in bf16 with fp32\n"
"                         accumulation; weights, optimizer and the rest fp32\n"
"                         (default fp32; doc/precision.md)\n"
"  --activation-precision fp32|bf16   with --precision bf16: the outputs of linear\n"
"                         layers and GELU/ReLU that products read, stored bf16\n"
"                         (GELU/ReLU run on bf16; the gradients around GELU\n"
"                         and attention bf16 too), and a CNN's tensors and\n"
"                         gradients between convolutions, batch norms and\n"
"                         pools; layer norm, the residual stream and other\n"
"                         gradients stay fp32 (default fp32)\n"
"  --tensor-layout auto|blocked|nhwc   how a CNN stores its image tensors:\n"
"                         auto (default) the layout its convolutions take on\n"
"                         this CPU (nhwc for bf16 on AMX, else nChw16c)\n"
"  --weight-layout plain|blocked   with --precision bf16: linear weights' bf16\n"
"                         copies in the parameters' order (default plain) or\n"
"                         in the layouts the products' kernels take (blocked)\n"
"  --bf16-emulated        run bf16 on a CPU without native bf16 (slow; refused\n"
"                         otherwise)\n"
"  --unfuse LIST          run these fusions as passes of their own, to measure\n"
"                         them: bias, residual, weight-copy, relu, bn-relu,\n"
"                         relu-backward, gelu-backward (comma list; default\n"
"                         none; doc/precision.md)\n"
"  --recompute none|blocks|all   activations the forward keeps: all of them,\n"
"                         each block's input (the backward runs a block's\n"
"                         forward again), or the first block's input (blocks\n"
"                         0..b again before block b); same numbers (default\n"
"                         none; doc/memory.md)\n"
"  --context T            gpt: tokens (bytes) per sample (default 128)\n"
"  --heads H              gpt, vit: attention heads, dividing the width (default 4)\n"
"  --patch P              vit: the side of its square patches, dividing the\n"
"                         image's sides (default 4)\n"
"  --pool mean|cls        vit: the head reads the tokens' mean or a class token\n"
"                         (default mean)\n"
"Training:\n"
"  --epochs N             passes over the training set (default 5)\n"
"  --steps N              train for exactly N steps instead of whole epochs\n"
"  --batch N              samples per step and worker (default 128)\n"
"  --accumulate K         K micro-batches of --batch samples a step: their\n"
"                         gradients add up before one reduction and one update\n"
"                         (default 1; not synth; doc/cli.md)\n"
"  --optimizer sgd|adamw  (default adamw)\n"
"  --lr X                 peak learning rate (default 0.001)\n"
"  --momentum X           SGD momentum (default 0.9)\n"
"  --weight-decay X       decoupled for AdamW, L2 for SGD; matrices only (default 0.01)\n"
"  --optimizer-moments fp32|bf16|bf16-sr   the optimizer's state (moments,\n"
"                         momentum) in bf16, rounded to nearest or stochastically;\n"
"                         weights fp32 (default fp32; doc/precision.md)\n"
"  --master-weights fp32|bf16-sr   AdamW's master weights of the matrices: fp32,\n"
"                         or in their bf16 copies, rounded stochastically\n"
"                         (--precision bf16; dp, localsgd, sdp; default fp32;\n"
"                         doc/precision.md)\n"
"  --schedule constant|cosine   learning-rate schedule (default cosine: linear\n"
"                         warmup, then cosine decay to 0 at the last step)\n"
"  --warmup N             warmup steps of the cosine schedule (default: 5% of the run)\n"
"  --seed N               seed of initialisation, shuffles and synthetic data (default 1)\n"
"Checkpoints:\n"
"  --checkpoint DIR       write the trained weights to DIR/final.safetensors, and\n"
"                         the whole training state to DIR/step-N.safetensors when\n"
"                         a signal stops the run and as --checkpoint-every says\n"
"  --checkpoint-every N|epoch   a step checkpoint every N steps (a strategy with\n"
"                         rounds: at the next round end), or after every epoch\n"
"                         (default: none)\n"
"  --keep K               keep the newest K step checkpoints (default 0: all)\n"
"  --resume DIR|FILE      continue a run from its newest step checkpoint in DIR\n"
"                         (or FILE), with the same options: bitwise the same run\n"
"  --usr1 stop|checkpoint on SIGUSR1 (sbatch --signal=USR1@T): stop like SIGTERM,\n"
"                         or write a step checkpoint and go on (default stop)\n"
"  --init FILE            start from a safetensors file's weights (a fresh\n"
"                         optimizer: fine-tuning); with 'subtrain eval': the\n"
"                         weights to evaluate on the test set\n"
"  subtrain eval --init FILE [data and model options]\n"
"                         evaluate saved weights on the test set (a batch norm's\n"
"                         running statistics: the file's, else re-estimated on\n"
"                         --bn-calibration training batches)\n"
"  subtrain export --init FILE -o FILE [data and model options]\n"
"                         the weights of FILE in PyTorch's layout, which\n"
"                         python/subtrain_torch.py loads, or back (doc/interop.md)\n"
"  --format torch|subtrain   export: the layout written (default torch)\n"
"  -o, --output FILE      export: the file written\n"
"Output:\n"
"  --metrics FILE         JSON Lines: one record per epoch and a final one\n"
"  --report memory        every worker's peak memory by kind at the end\n"
"  --report align[=N]     sdp: every N steps (default 50), the cosine between each\n"
"                         worker's subnetwork gradient and the full model's on the\n"
"                         same batch (in the epoch lines and --metrics); both:\n"
"                         --report memory,align\n"
"  --progress auto|bar|plain|none   live bar on a terminal, one line per epoch\n"
"                         otherwise (default auto)\n"
"  --sample N             --model gpt: after training, print N bytes the trained\n"
"                         model generates after --prompt, seeded by --seed\n"
"                         (default 0: none)\n"
"  --prompt TEXT          the text the sample continues (default: a newline)\n"
"  --temperature X        sampling temperature, >= 0 (default 0.8; 0: greedy)\n"
"  --top-k K              draw among the K likeliest bytes (default 40; 0: all)\n"
"  -q, --quiet            print nothing but errors (and a --sample's text)\n"
"Configuration:\n"
"  --config FILE          read options from FILE first, one 'key = value' a line\n"
"                         (key: a long option without its dashes; flags: true or\n"
"                         false; '#' comments); the command line overrides it.\n"
"                         FILE may be a metrics file: its first record's run\n"
"                         configuration (doc/provenance.md)\n"
"  --dump-config          print the resolved configuration in that form, every\n"
"                         option, and exit without training\n"
"  -h, --help             this text\n"
"  -V, --version          version and library versions\n"
"\n"
"Exit status: 0 success, 1 runtime failure (data, memory, numerics), 2 bad usage,\n"
"130/143/138 stopped by SIGINT/SIGTERM/SIGUSR1 after the current step (or before\n"
"training, when the signal comes while the run starts).\n"
"Documentation: doc/cli.md in the source tree.\n", f);
}
