/*
 * subtrain/subtrain.h — the umbrella header of libsubtrain.
 *
 * Topic headers:
 *   version.h SUBTRAIN_VERSION (headers), st_version() (library)
 *   status.h  status codes, last error message
 *   arena.h   per-owner memory arena with byte accounting
 *   rng.h     deterministic, splittable random numbers
 *   data.h    IDX files, synthetic data, shuffles, batches
 *   params.h  flat parameter layout
 *   model.h   model instances of the library's kinds (mlp, resnet, gpt, ...) on oneDNN
 *   optim.h   SGD, AdamW, learning-rate schedules
 *   topo.h    topology, placement plan, binding, NUMA allocation (hwloc)
 *   comm.h    the reduction engine (reduce-scatter, all-gather)
 *   world.h   the processes of a run: this one alone, or an MPI job's ranks
 *   subnet.h  subnetworks: units, coverage, assignments to workers
 *   synth.h   synthetic-label training: cuts, worker split, labels
 *   train.h   the training loop and metrics records
 *   strategy.h  the strategies as a front end sees them: names, options
 *   trainer.h a training run as an object, stepped by the caller
 *   checkpoint.h  safetensors files, written atomically, read back checked
 *   torch_layout.h  a model's weights as PyTorch lays them out (doc/interop.md)
 * Not included here: quad.h, IST theory on quadratics (subtrain quad), a
 * separate study; layer_timing.h, single layers timed outside a model
 * (bench/bench_conv).  Include them by name.
 * Every public symbol starts with st_ (types, functions) or ST_ (macros,
 * enumerators).
 */
#ifndef SUBTRAIN_H
#define SUBTRAIN_H

#include <subtrain/version.h>
#include <subtrain/status.h>
#include <subtrain/arena.h>
#include <subtrain/rng.h>
#include <subtrain/data.h>
#include <subtrain/params.h>
#include <subtrain/model.h>
#include <subtrain/optim.h>
#include <subtrain/topo.h>
#include <subtrain/comm.h>
#include <subtrain/world.h>
#include <subtrain/subnet.h>
#include <subtrain/synth.h>
#include <subtrain/train.h>
#include <subtrain/strategy.h>
#include <subtrain/trainer.h>
#include <subtrain/checkpoint.h>
#include <subtrain/torch_layout.h>

#endif /* SUBTRAIN_H */
