#!/bin/sh
# Reproduces every number of docs/frontier.md. Usage: docs/frontier/run.sh [build/exatrain]
set -e
EXE=${1:-build/exatrain}
D=$(dirname "$0")
for model in gpt3-22b gpt3-175b gpt3-1t; do
  for nodes in 128 384 9408; do
    gpus=$((nodes * 8))
    case $nodes in 9408) gbs=18816 ;; *) gbs=1536 ;; esac
    echo "== $model on $nodes nodes ($gpus GCDs), global_batch $gbs"
    # Plans that tie exactly (22B on 384 nodes: ZeRO-1 = ZeRO-2) rank by memory, the leaner first
    # (src/plan/search.cpp ranks_before), whatever --top is; the same --top keeps the files alike.
    "$EXE" plan "$D/$model.toml" --json --top 3 --set parallel.gpus=$gpus \
      --set parallel.global_batch=$gbs --set machine.node_mtbf_hours=50000 > "$D/$model-$nodes.json"
    "$EXE" plan "$D/$model.toml" --top 3 --set parallel.gpus=$gpus \
      --set parallel.global_batch=$gbs --set machine.node_mtbf_hours=50000
  done
done
# The best plan without ZeRO-3 per case (ZeRO-3's cost is the least validated part of the model,
# docs/frontier.md "Caveats"): zero fixed to 0, 1 and 2. ZeRO-1 and ZeRO-2 differ in both ways:
# ZeRO-1 (Megatron's distributed optimizer) reduce-scatters the gradients once per step but keeps
# full gradients; ZeRO-2 (DeepSpeed stage 2) keeps a 1/dp gradient shard and so reduce-scatters once
# per micro-batch. Neither dominates, so both are listed.
for model in gpt3-22b gpt3-175b gpt3-1t; do
  for nodes in 128 384 9408; do
    gpus=$((nodes * 8))
    case $nodes in 9408) gbs=18816 ;; *) gbs=1536 ;; esac
    for zero in 0 1 2; do
      echo "== no ZeRO-3: $model on $nodes nodes, zero = $zero"
      "$EXE" plan "$D/$model.toml" --top 1 --set parallel.gpus=$gpus --set parallel.zero=$zero \
        --set parallel.global_batch=$gbs --set machine.node_mtbf_hours=50000 | sed -n '1p;4p' || true
    done
  done
done
# Single plans quoted in docs/frontier.md's text: the Frontier study's own layouts (ZeRO-1, full
# activation recomputation: 175B at TP 4 x PP 16, 1T at TP 8 x PP 64 and TP 4 x PP 128) on 128 nodes,
# and the previous version of the page's 1T whole-machine winner (ZeRO-2, tp 8 x pp 16) re-predicted.
quoted() {  # quoted MODEL NODES SETTINGS...
  model=$1; nodes=$2; shift 2
  gpus=$((nodes * 8))
  case $nodes in 9408) gbs=18816 ;; *) gbs=1536 ;; esac
  echo "== quoted: $model on $nodes nodes, $*"
  sets=""
  for s in "$@"; do sets="$sets --set parallel.$s"; done
  # shellcheck disable=SC2086  # $sets is a list of words on purpose
  "$EXE" plan "$D/$model.toml" --top 1 --set parallel.gpus=$gpus --set parallel.global_batch=$gbs \
    --set machine.node_mtbf_hours=50000 $sets | sed -n '4p;9,17p'
}
quoted gpt3-175b 128 tp=4 pp=16 zero=1 recompute=full
quoted gpt3-1t 128 tp=8 pp=64 zero=1 recompute=full
quoted gpt3-1t 128 tp=4 pp=128 zero=1 recompute=full
quoted gpt3-1t 9408 tp=8 pp=16 cp=1 vp=8 zero=2 micro_batch=1 recompute=none
