#!/usr/bin/env bash
# `make run`: the main job on the embedded default. Prepares the bundled corpus (cached in
# data-cache/), trains the small GPT of jobs/default.toml for a few minutes, reports the
# validation loss, prints a sample and where the run directory, plot and checkpoint are.
set -euo pipefail
BUILD=${1:-build}
EXA="$BUILD/exatrain"
RUN_DIR=runs/default

"$EXA" data prepare --input corpus/kjv.txt.xz --out data-cache/kjv-bpe4096 --vocab-size 4096 --reuse
rm -rf "$RUN_DIR"   # `make run` always starts a fresh run; `exatrain train --resume auto` continues one
"$EXA" train jobs/default.toml --set train.run_dir="$RUN_DIR"
CKPT=$(ls -d "$RUN_DIR"/checkpoints/step_* | tail -n 1)
echo
echo "sample from $CKPT:"
"$EXA" sample "$CKPT" --prompt "And God said" --tokens 60 --temperature 0.8 --top-k 40
echo
echo "run directory: $RUN_DIR (metrics.jsonl, report.svg, checkpoints/)"
echo "plot:          $RUN_DIR/report.svg"
echo "checkpoint:    $CKPT"
