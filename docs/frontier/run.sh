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
    "$EXE" plan "$D/$model.toml" --json --top 2 --set parallel.gpus=$gpus \
      --set parallel.global_batch=$gbs --set machine.node_mtbf_hours=50000 > "$D/$model-$nodes.json"
    "$EXE" plan "$D/$model.toml" --top 3 --set parallel.gpus=$gpus \
      --set parallel.global_batch=$gbs --set machine.node_mtbf_hours=50000
  done
done
