#!/bin/sh
# scripts/scaling_model.sh — a model of many-core and multi-node scaling
# for data parallelism and SDP, from measured per-step numbers and the
# machine's bandwidths given as parameters (doc/scaling.md explains it).
#
#   P=17600000 TC_MS=21 SDP_TC=0.46 STREAM_GBS=200 LINK_GBS=12.5 sh scripts/scaling_model.sh
#
# Parameters (environment; defaults: resmlp d8 w1024 measured here):
#   P           parameters of the model
#   TC_MS       forward + backward ms of one worker's step (its batch)
#   SDP_TC      SDP's compute per step as a fraction of dp's (measured)
#   DP_BYTES    bytes the in-process engine moves per worker and step, per
#               parameter (measured: comm_bytes_per_worker_step / P)
#   SDP_BYTES   SDP's bytes as a fraction of dp's (measured)
#   STREAM_GBS  a node's memory bandwidth (STREAM add), GB/s
#   LINK_GBS    a node's network bandwidth, GB/s each way
#   T           threads per worker (teams: one replica per T cores)
#   TEAM_EFF    a team's speed-up over one thread, divided by T (measured)
#
# The step is compute, then the reduction, not overlapped (subtrain does
# not overlap them).  Per node, the in-process engine moves DP_BYTES x P
# bytes per worker and step (dp: each worker reads its shard of every
# gradient and the whole master vector, writes its shard and its replica),
# all workers of a node sharing its STREAM bandwidth; SDP moves SDP_BYTES
# of that (only the holders' elements).  Between nodes each rank (one per node) sends and
# receives 2 (R - 1) / R x P x 4 bytes (the MPI backend's two exchanges);
# SDP the same unless a node's workers together miss units, which with
# more than 1 / C workers per node they do not.  Efficiency = the ideal
# step (every core computing its batch alone) / (compute + node reduction
# + network), each against its own compute (SDP's step computes less: a
# subnetwork); step ms compares the two; a team worker computes T batches
# on T cores at TEAM_EFF.
set -eu
P=${P:-17600000}
TC_MS=${TC_MS:-21}
SDP_TC=${SDP_TC:-0.46}
DP_BYTES=${DP_BYTES:-14.0}
SDP_BYTES=${SDP_BYTES:-0.60}
STREAM_GBS=${STREAM_GBS:-200}
LINK_GBS=${LINK_GBS:-12.5}
T=${T:-1}
TEAM_EFF=${TEAM_EFF:-1}
awk -v P="$P" -v tc="$TC_MS" -v sdp="$SDP_TC" -v dpb="$DP_BYTES" -v sdpb="$SDP_BYTES" -v bw="$STREAM_GBS" \
    -v link="$LINK_GBS" -v T="$T" -v te="$TEAM_EFF" 'BEGIN {
    if (T == 1) te = 1
    printf "P %d, compute %.1f ms/step/worker (SDP x %.2f), STREAM %.0f GB/s/node, link %.1f GB/s, T %d (team efficiency %.2f)\n",
        P, tc, sdp, bw, link, T, te
    printf "| cores/node | nodes | net ms | dp: reduce ms | dp: step ms | dp: eff. | SDP C=0.5: reduce ms | SDP: step ms | SDP: eff. |\n"
    printf "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    split("16 64 128", cores, " ")
    split("1 2 4 8", nodes, " ")
    for (i = 1; i <= 3; i++) for (j = 1; j <= 4; j++) {
        n = cores[i] / T; R = nodes[j]
        node_ms = n * dpb * P / (bw * 1e9) * 1e3         # workers share the node
        net_ms = R > 1 ? 2 * (R - 1) / R * P * 4 / (link * 1e9) * 1e3 : 0
        tcw = tc / te                                    # a team: T x the batch on T cores
        eff = tc / (tcw + node_ms + net_ms)
        s_node = sdpb * node_ms; s_net = net_ms; s_tc = sdp * tcw
        s_eff = sdp * tc / (s_tc + s_node + s_net)
        printf "| %d | %d | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", cores[i], R, net_ms, node_ms, tcw + node_ms + net_ms, eff, s_node, s_tc + s_node + s_net, s_eff
    }
}'
