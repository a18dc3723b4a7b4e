#!/bin/sh
# scripts/scaling_model.sh — a model of many-core and multi-node scaling
# for data parallelism, from measured per-step numbers and the machine's
# bandwidths given as parameters (doc/scaling.md explains it): the
# efficiency with a replica of the weights per worker ("replicas") and
# with one weight copy per NUMA domain ("shared", what subtrain runs).
#
#   B=128 PRECISION=bf16 STREAM_GBS=200 D=2 sh scripts/scaling_model.sh
#
# Parameters (environment; defaults: resmlp d8 w1024 measured here):
#   P           parameters of the model
#   B           samples per worker and step (the per-worker batch)
#   TC_MS       forward + backward ms of one worker's step of 32 samples on
#               one core, fp32 (measured); a step of B takes TC_MS x B / 32
#   PRECISION   fp32, or bf16: compute BF16_SPEEDUP times faster
#   BF16_SPEEDUP  bf16 compute's speed-up over fp32 (a parameter: 2 to 4
#               with AMX; not measured here)
#   D           NUMA domains per node, the workers spread evenly over them
#   STREAM_GBS  a node's memory bandwidth (STREAM add), GB/s
#   LINK_GBS    a node's network bandwidth, GB/s each way
#   OVERLAP     the share of the reduce-scatter and update run during the
#               backward pass (dp reduces and updates each part of its shard
#               as the backward completes it: 0.9 measured at 2 workers
#               here; default 0, the step without it); with two levels
#               (D > 1) the domains' partials too, as their workers'
#               backwards complete them (the same share assumed: not
#               measured, this machine has one NUMA node)
#   CORE_GBS    what one core streams alone, GB/s (a worker's own share of
#               the reduction takes its core this long, overlapped or not)
#   T           threads per worker (teams: one worker per T cores)
#   TEAM_EFF    a team's speed-up over one thread, divided by T (measured)
#
# The step is compute, then the reduction.  Per node the engine moves, per
# worker and step and per parameter, with n workers in D domains of n / D
# (the plan's own counts, doc/reduction.md; `subtrain topo` prints them):
#   replicas  12 + 4/n + 8 (D - 1)/n: its shard of every gradient (4), its
#             mean (4/n), the whole master vector read and its replica
#             written (8), the partials of the two levels (8 (D - 1)/n);
#   shared    4 + 4/n + 16 (D - 1)/n: the gradients and the mean, the
#             partials, and each domain's copy of the other domains' shards
#             read and written once (8 (D - 1)/n); nothing on one domain.
# All workers of a node share its STREAM bandwidth: the node's reduction
# takes node = n x bytes / STREAM.  Run after the backward, all of it adds
# to the step; the part run during it (OVERLAP of the reduce-scatter and
# update; the all-gather comes after the update) shares the backward's
# time with the others' compute, and adds only the worker's own streaming
# time (bytes / CORE_GBS), or what of the node's does not fit in the
# compute (node - compute), whichever is longer.  The compute's own memory traffic
# is not modelled.  Between nodes each rank (one per node) sends and
# receives 2 (R - 1) / R x P x 4 bytes (the MPI backend's two exchanges).
# Efficiency = the worker's compute / (its compute + the reduction's
# exposed time + the network).
set -eu
P=${P:-17600000}
B=${B:-128}
TC_MS=${TC_MS:-21}
PRECISION=${PRECISION:-fp32}
BF16_SPEEDUP=${BF16_SPEEDUP:-3}
D=${D:-1}
STREAM_GBS=${STREAM_GBS:-200}
LINK_GBS=${LINK_GBS:-12.5}
OVERLAP=${OVERLAP:-0}
CORE_GBS=${CORE_GBS:-15}
T=${T:-1}
TEAM_EFF=${TEAM_EFF:-1}
case $PRECISION in
fp32 | bf16) ;;
*) echo "scaling_model: PRECISION must be fp32 or bf16, got '$PRECISION'" >&2; exit 2 ;;
esac
awk -v P="$P" -v B="$B" -v tc32="$TC_MS" -v prec="$PRECISION" -v sp="$BF16_SPEEDUP" -v D="$D" \
    -v bw="$STREAM_GBS" -v link="$LINK_GBS" -v ov="$OVERLAP" -v core="$CORE_GBS" -v T="$T" \
    -v te="$TEAM_EFF" 'function exposed(node, bytes, tcw,   own, late) {
        own = bytes * P / (core * 1e9) * 1e3             # its own streaming, on its core
        late = node - tcw > own ? node - tcw : own
        return (1 - ov) * node + ov * late
    }
    BEGIN {
    if (T == 1) te = 1
    tc = tc32 * B / 32 / (prec == "bf16" ? sp : 1)     # one worker, one core
    printf "P %d, batch %d a worker, %s compute %.1f ms/step/worker%s, %d NUMA domain%s a node, STREAM %.0f GB/s/node, link %.1f GB/s, overlap %.2f, T %d (team efficiency %.2f)\n",
        P, B, prec, tc, prec == "bf16" ? sprintf(" (fp32 / %.1f)", sp) : "", D, D == 1 ? "" : "s",
        bw, link, ov, T, te
    printf "| cores/node | nodes | compute ms | net ms | replicas: B/param | reduce ms | eff. | shared: B/param | reduce ms | eff. |\n"
    printf "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    split("16 64 128", cores, " ")
    split("1 2 4 8", nodes, " ")
    for (i = 1; i <= 3; i++) for (j = 1; j <= 4; j++) {
        n = cores[i] / T; R = nodes[j]
        tcw = tc / te                                    # a team: T x the batch on T cores
        net_ms = R > 1 ? 2 * (R - 1) / R * P * 4 / (link * 1e9) * 1e3 : 0
        rb = 12 + 4 / n + 8 * (D - 1) / n                # per worker and parameter
        sb = 4 + 4 / n + 16 * (D - 1) / n
        r_ms = n * rb * P / (bw * 1e9) * 1e3             # the node, shared by n workers
        s_ms = n * sb * P / (bw * 1e9) * 1e3
        # the all-gather (a replica of 8 a parameter, or the copies between
        # domains, 8 (D - 1)/n) runs after the update: never overlapped
        r_ag = n * 8 * P / (bw * 1e9) * 1e3
        s_ag = n * 8 * (D - 1) / n * P / (bw * 1e9) * 1e3
        r_eff = tc / (tcw + exposed(r_ms - r_ag, (rb - 8) * T, tcw) + r_ag + net_ms)
        s_eff = tc / (tcw + exposed(s_ms - s_ag, (sb - 8 * (D - 1) / n) * T, tcw) + s_ag + net_ms)
        printf "| %d | %d | %.1f | %.1f | %.2f | %.1f | %.2f | %.2f | %.1f | %.2f |\n", cores[i], R,
            tcw, net_ms, rb, r_ms, r_eff, sb, s_ms, s_eff
    }
}'
