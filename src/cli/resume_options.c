/* cli/resume_options.c — the options a resume compares: all of
 * --dump-config's (st_cli_config_each), so that an option added later is
 * compared too, less the few below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/resume_options.h"

/* The options that may change on a resume, and why: none changes what
 * the steps compute.  doc/checkpoints.md lists them; every other option
 * must be the same as the stopped run's. */
static const char *const may_change[] = {
    "data",              /* its path: the library compares the data's content */
    "workers",           /* per rank: the library compares the workers of all ranks */
    "cpuset",            /* which cores run the workers, not what they compute */
    "oversubscribe",     /* allows more workers than cores, not other numbers */
    "weights",           /* where the weights lie (a copy a domain or a replica a
                          * worker), not what they are: the same bits either way */
    "checkpoint",        /* where checkpoints go */
    "checkpoint-every",  /* when they are written: writing one changes nothing */
    "keep",              /* how many of them stay */
    "resume",            /* the checkpoint itself */
    "usr1",              /* what SIGUSR1 does: stop, or checkpoint and go on */
    "init",              /* where the stopped run started: a resume starts from its file */
    "metrics",           /* where the records go (a resume appends to them) */
    "progress",          /* what the terminal shows */
    "quiet",             /* what the terminal shows */
    "sample",            /* text generated after training, from the trained weights */
    "prompt",            /* the same */
    "temperature",       /* the same */
    "top-k",             /* the same */
    "recompute",         /* what the forward keeps: the same numbers in every mode */
};

static int may_change_on_resume(const char *key)
{
    for (size_t i = 0; i < sizeof may_change / sizeof *may_change; i++)
        if (strcmp(may_change[i], key) == 0)
            return 1;
    return 0;
}

/* Two passes over the options: the first counts (list NULL), the second
 * copies into the buffers the first sized. */
typedef struct collect {
    st_cli_resume_options *r;
    size_t used;
} collect;

static void take(const char *key, const char *value, void *user)
{
    collect *c = user;
    if (may_change_on_resume(key))
        return;
    const size_t k = strlen(key) + 1, v = strlen(value) + 1;
    if (c->r->list) {
        char *t = c->r->text + c->used;
        memcpy(t, key, k);
        memcpy(t + k, value, v);
        c->r->list[c->r->n] = (st_safetensors_meta_entry){ t, t + k };
    }
    c->r->n++;
    c->used += k + v;
}

int st_cli_resume_options_make(const st_cli_options *o, st_cli_resume_options *out)
{
    memset(out, 0, sizeof *out);
    collect c = { out, 0 };
    st_cli_config_each(o, take, &c);
    out->list = malloc((size_t)(out->n ? out->n : 1) * sizeof *out->list);
    out->text = malloc(c.used ? c.used : 1);
    if (!out->list || !out->text) {
        st_cli_resume_options_free(out);
        fprintf(stderr, "subtrain: out of memory for the run's options\n");
        return -1;
    }
    out->n = 0;
    c.used = 0;
    st_cli_config_each(o, take, &c);
    return 0;
}

void st_cli_resume_options_since(st_cli_resume_options *r, const st_safetensors *file)
{
    char *argv[] = { "subtrain", NULL }, err[256];
    st_cli_options d;
    st_cli_resume_options defaults = { 0 };
    if (st_cli_parse(1, argv, &d, err, sizeof err) != 0 ||
        st_cli_resume_options_make(&d, &defaults) != 0)
        return;   /* every option stays compared */
    int kept = 0;
    for (int i = 0; i < r->n; i++) {
        char key[256];
        snprintf(key, sizeof key, "subtrain.option.%s", r->list[i].key);
        const char *was = st_safetensors_meta(file, key);
        int at_default = 0;
        for (int j = 0; j < defaults.n; j++)
            if (strcmp(defaults.list[j].key, r->list[i].key) == 0)
                at_default = strcmp(defaults.list[j].value, r->list[i].value) == 0;
        if (at_default && was && !*was)   /* an earlier version's "" (default): as it wrote */
            r->list[i].value = "";
        if (!at_default || was)
            r->list[kept++] = r->list[i];
    }
    r->n = kept;
    st_cli_resume_options_free(&defaults);
}

void st_cli_resume_options_free(st_cli_resume_options *r)
{
    free(r->list);
    free(r->text);
    memset(r, 0, sizeof *r);
}
