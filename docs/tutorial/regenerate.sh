#!/usr/bin/env bash
# Regenerates the tutorial from the tools: runs every chapter's commands (or the chapters given)
# and rewrites, in place, their ```output blocks (from what the commands printed), their
# <!--= ...--> figures and docs/tutorial/figures/*.svg (the SVGs the commands wrote). Review the
# result with `git diff docs/tutorial` before committing: a figure that moved is either the
# machine (timings: expected) or a change of the tools (say why in the commit).
#
# Usage: docs/tutorial/regenerate.sh [BUILD_DIR] [CHAPTER.md ...]     (default: build, all chapters)
# The same runner without --update is the test: `cd build && ctest -L tutorial`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
CHAPTERS=("$@")
[ ${#CHAPTERS[@]} -gt 0 ] || CHAPTERS=("$ROOT"/docs/tutorial/[0-9][0-9]-*.md)
# The corpus once, as the tests' fixture does; the runner's environment adds what mpirun needs
# on a small machine or as root (tests/tutorial/tutorial_runner.py, run_env).
(cd "$ROOT" && "$BUILD/exatrain" data prepare --input corpus/kjv.txt.xz --out data-cache/kjv-bpe4096 \
  --vocab-size 4096 --reuse >/dev/null)
for chapter in "${CHAPTERS[@]}"; do
  stem=$(basename "$chapter" .md)
  /usr/bin/python3 "$ROOT/tests/tutorial/tutorial_runner.py" "$chapter" --repo "$ROOT" --build "$BUILD" \
    --scratch "$BUILD/tests/tutorial/regen-$stem" --update
done
