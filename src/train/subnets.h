/*
 * train/subnets.h — private: what the subnetwork strategies (sdp.c, ist.c)
 * share: which units there are (resmlp blocks, or neuron groups of every
 * layer), a round's assignment of units to workers, the model config of a
 * worker's subnetwork in it, the owners' saved shards a rebuilt subnetwork
 * loads from, and worker 0's full model for evaluation.
 *
 * A common run helper: called by the strategies, calls no strategy
 * (strategy.h has the dependency direction).
 */
#ifndef SUBTRAIN_TRAIN_SUBNETS_H
#define SUBTRAIN_TRAIN_SUBNETS_H

#include "train/run.h"

/* What a worker keeps across rebuilds, outside its model's part of the
 * arena: its master shard (which 0) and, ist keeping optimizer state, its
 * shard of the state vectors (which 1, 2).  Written once by the worker at
 * its start, read by the others at round ends. */
typedef struct subnet_saved {
    float *master;
    float *state[2];
} subnet_saved;

typedef struct subnets {
    int neuron_units;        /* units: neuron groups of every width layer, else
                              * layer groups (blocks) */
    int backward;            /* backward masking: the full model, gradients of
                              * the held units only */
    int unheld_possible;     /* some element may be held by nobody */
    int layers;              /* layer groups, or width layers (neuron units) */
    int n_sections;          /* units come in sections, each dealt evenly:
                              * neurons: the width layers, sections[l] groups
                              * each (a ResNet's stages differ); blocks: runs of
                              * groups (a ResNet's stages) */
    int *sections;
    st_assignment assign;    /* which worker holds which unit */
    int k;                   /* holders per unit */
    subnet_saved *saved;     /* n */
    /* ranks > 1: the saved shards of every rank, gathered into full
     * vectors at a round end (which 0, 1, 2 as in subnet_saved), since a
     * rebuilt subnetwork cannot read another rank's memory; NULL: one
     * process, the subnetworks read the owners' saved shards directly. */
    float *gathered[3];
    int n_gathered;
    st_arena eval_arena;     /* worker 0's full model for evaluation */
    st_model *eval_model;
    /* A sizing run: the assignments laid out so far (each n_all x units
     * bytes of assign.held, with a hash), and whether the current one is
     * one of them (st_subnets_laid_before). */
    uint8_t *laid;
    uint64_t *laid_hash;
    int n_laid, cap_laid;
    int repeat;
    /* A bf16 master of forward-masked subnetworks: the full model's weight
     * copies, whose masters are the engine's bf16 master shards
     * (st_comm_shard_params16); NULL, 0: none. */
    st_range *m16;
    int n_m16;
} subnets;

/* Units, as the model's layers declare them (st_model_config_units):
 * neuron groups of every width layer (subnet neuron; or, when
 * without_groups, a model that declares no layer groups: its only units
 * are neurons), else layer groups (resmlp's blocks). */
int st_subnets_neuron_units(const st_train_config *c, st_subnet_kind subnet, int without_groups);
/* Whether some element may be held by nobody: neuron units, forward
 * masked, of a model with a layer between two width layers (mlp's
 * hidden-to-hidden matrices).  The engines are told, and masters of such
 * elements are initialised by the strategy. */
int st_subnets_unheld_possible(const st_train_config *c, int neuron_units, int backward);

/* The layout check of sdp and ist (their ops' layout): refuses `workers`
 * workers (every rank's) that k holders per unit leave without a unit (a
 * block, or a group of neurons in some width layer), in a line naming the
 * strategy (as --strategy spells it) and the options: sdp's --subnet and
 * --coverage when coverage > 0 (its C, of which k came), one holder each
 * otherwise.  From the config alone: a model that cannot be declared yet
 * is let through. */
st_status st_subnets_check_layout(const st_train_config *c, const char *strategy, int workers,
                                  int k, int neuron_units, double coverage);

/* Before the parallel region, the layout checked: the flags, k holders
 * per unit, the assignment of round 0. */
st_status st_subnets_prepare(subnets *s, const run_shared *r, int k, int neuron_units,
                             int backward);
void st_subnets_release(subnets *s);

/* Where (full layout) elements held by nobody can be: the weights between
 * two width layers (st_model_config_chained_ranges), at most cap of them;
 * 0 when none can be unheld. */
#define ST_MAX_UNHELD_RANGES 1024
int st_subnets_unheld_ranges(const subnets *s, const run_shared *r, st_range *out, int cap);

/* s->assign <- the assignment of `round`; a sizing run's also sets
 * s->repeat (st_subnets_laid_before). */
st_status st_subnets_draw(subnets *s, const run_shared *r, uint64_t round);
/* A sizing run: whether the current assignment was laid out before, so
 * that laying it out again would repeat every worker's layout, and its
 * arena's peaks with it; else it is remembered (up to a bound of
 * assignments and bytes, beyond which every draw counts as new). */
int st_subnets_laid_before(subnets *s);

/* Worker wid's model config in the current assignment; *buf holds its
 * lists until the model is built (the caller frees it). */
st_status st_subnets_config(const subnets *s, const run_shared *r, int wid, int train_scale,
                            st_train_config *mine, int **buf);

/* A rebuilt subnetwork gets the current values of what it holds from the
 * owners' saved shards (shards of r->comm): into dst (w's compact
 * vector), from every worker's saved master (which 0) or state (which 1,
 * 2). */
st_status st_subnets_load_saved(const subnets *s, const run_shared *r, st_worker *w, float *dst,
                                int which);

/* Worker 0: the full model of `model` for evaluation, in an arena of its
 * own (it is not training memory). */
st_status st_subnets_build_eval(subnets *s, const st_train_config *cfg,
                                const st_model_config *model, const st_chunk_backend *backend);
/* Copies every owner's shard into the full model: from `masters`' master
 * shards (after an all-gather, the current values), or from the saved
 * masters (from_saved: ist keeps its averaged parameters there). */
st_status st_subnets_load_full(subnets *s, const run_shared *r, st_comm *masters, int from_saved);
/* A bf16 master of compact subnetworks: s->m16 <- the full model's weight
 * copies (the model laid out in address space alone, never written). */
st_status st_subnets_master16(subnets *s, const run_shared *r);
/* Owner k's master shard of `masters` as fp32, into dst (the shard's
 * length): the fp32 elements copied, those of s->m16 widened from the
 * bf16 shard (exact). */
void st_subnets_shard_widen(const subnets *s, st_comm *masters, int k, float *dst);
/* The reverse, src the shard's values: those of s->m16 rounded to the
 * nearest bf16 (exact for values on the grid: saved or resumed masters). */
void st_subnets_shard_store(const subnets *s, st_comm *masters, int k, const float *src);
/* Over ranks: room for `kinds` gathered vectors (prepare; no-op with one
 * process), and, by worker 0 of every rank after every worker saved its
 * shards (a round end), every rank's saved shards into them. */
st_status st_subnets_prepare_gather(subnets *s, const run_shared *r, int kinds);
st_status st_subnets_gather_saved(subnets *s, const run_shared *r, st_comm *c);
/* Evaluation always uses the full model: worker 0 fills it and runs the
 * whole test set; the others wait. */
st_status st_subnets_evaluate_full(subnets *s, run_shared *r, st_comm *masters, int from_saved,
                                   st_worker *w, double *loss, double *acc);

#endif /* SUBTRAIN_TRAIN_SUBNETS_H */
