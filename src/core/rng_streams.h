/*
 * core/rng_streams.h — private: the namespaces under a run's seed.
 *
 * Every random draw of a run comes from st_rng_split(st_rng_seed(seed),
 * NAMESPACE) and then further splits below it.  Two users of one namespace
 * draw the same numbers, on purpose: a segment (nn/segment.c) must draw
 * the initial values of its layers exactly as the full mlp (nn/model.c)
 * does, or the joined network would not be the mlp's.  So the values that
 * more than one file needs, or that must not collide with another
 * namespace, have a name here instead of a literal in each file.
 *
 * Other namespaces, each used by one file only: 0x0DA7A (epoch orders,
 * data/dataset.c), 0x5E7A7 (synthetic data sets, data/synthetic.c), 0xA551
 * (sdp/ist assignments, subnet/assignment.c), 0xA0C7 (augmentation,
 * data/augment.c), 0x5A3D (sampling text from a gpt model,
 * nn/generate.c), 0x057A7E (stochastic rounding of a bf16 optimizer
 * state, optim/state16.c), 0x3A57E4 (stochastic rounding of a bf16
 * master, optim/state16.c).  A new one must differ from all of these.
 */
#ifndef SUBTRAIN_CORE_RNG_STREAMS_H
#define SUBTRAIN_CORE_RNG_STREAMS_H

/* Initial parameter values: stream i is tensor i of the full model's layout
 * (nn/model.c, and nn/segment.c for an mlp's segments). */
#define ST_RNG_STREAM_INIT 0x1A17ull

/* synth: the synthetic labels, one stream per (cut, class)
 * (train/synth_plan.c). */
#define ST_RNG_STREAM_SYNTH_LABELS 0x5117ull

/* synth: the noise added to a synthetic label fed to the next segment, one
 * stream per segment, then per (epoch, position in the order)
 * (train/synth.c). */
#define ST_RNG_STREAM_SYNTH_NOISE 0x4015Eull

/* Non-iid splits (data/split.c): below it, stream 0 deals the samples
 * (each class's shuffle, a Dirichlet split's proportions), stream 1 the
 * epochs' orders (per epoch, then worker, then pass over its split). */
#define ST_RNG_STREAM_SPLIT 0x5B117ull

/* Compressed communication (train/compress.c): below it, per step, then
 * per shard, the coordinates that random-k keeps; quad's random-k
 * (quad/cases.c) draws its own below the same name. */
#define ST_RNG_STREAM_RANDK 0x7A9D4ull

#endif /* SUBTRAIN_CORE_RNG_STREAMS_H */
