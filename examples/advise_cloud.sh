#!/usr/bin/env bash
# From a profile to a cloud recommendation, with what the model cannot know said out loud.
#
# The all-reduce model separates the network's bandwidth term from its per-byte overhead only
# from samples at two bandwidths or more, so the profile measures its microbenchmark at 500mbit
# and again at 2gbit (fit_bandwidths: one short extra run, about 11 s here). Every sample has 2
# ranks, so the ring-step latency cannot be told apart from the per-call cost: it is held at
# 25 us and the rest fitted (fit refuses otherwise, naming the two terms). Predictions and advice
# carry 95% intervals; advise marks a setup whose interval straddles the budget "may miss".
#
# Needs root for the emulated machines (network namespaces); about two minutes on 2 cores.
# Usage: examples/advise_cloud.sh [OUT]
set -euo pipefail
out=${1:-out/advise-example}
recperf() { "${RECPERF:-recperf}" "$@"; }

recperf stalls profile --workload dlrm --ranks 2 --nodes 2 --bandwidth 500mbit --iters 10 \
    --set profile.fit_bandwidths=2gbit --out "$out/profile"
recperf stalls fit --profiles "$out/profile" --hold alpha_s=25e-6 --out "$out/model.json"
for bw in 500mbit 10gbit 100gbit; do   # the ring's 2(N-1)/N x bytes / bandwidth term shrinks
    recperf stalls predict --model "$out/model.json" --grad-bytes 8.5e6 --layers 2 --ranks 2 \
        --nodes 2 --bandwidth "$bw" --json
done
recperf stalls advise --profile "$out/profile" --model "$out/model.json" --budget-h 2 \
    --out "$out/advice"
