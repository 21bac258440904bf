#!/usr/bin/env bash
# check_layering.sh CMAKE BUILD_DIR "PROBES" "PROBE_TARGETS" "CONTROLS" (tests/layering/CMakeLists.txt):
# every probe (an include of a room its room may not use; built by its room's PROBE_TARGET) must
# fail to compile because the header is not found; every control (the includes a room may use) must compile. A relative include
# ("../train/session.hpp", "model/../train/session.hpp") would reach past the include roots, so
# no include path under src/ has a "." or ".." segment.
set -u
cmake=$1 build=$2
read -r -a probes <<< "${3//;/ }"
read -r -a probe_targets <<< "${4//;/ }"
read -r -a controls <<< "${5//;/ }"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
src=$(cd "$(dirname "$0")/../../src" && pwd)
# Any "." or ".." path segment, in quotes or angle brackets ("../x.hpp", "model/../train/x.hpp",
# <../train/train/x.hpp>): each can climb out of an include root into a room not used.
if grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]([^>"]*/)?\.{1,2}/' "$src"; then
  echo "FAIL: the relative includes above bypass the rooms' include roots; write \"<room>/<header>\""; exit 1
fi
echo "ok: no relative include under src/"
if ! "$cmake" --build "$build" --target "${controls[@]}" > "$log" 2>&1; then
  echo "FAIL: an allowed include does not compile:"; tail -30 "$log"; exit 1
fi
echo "ok: ${#controls[@]} rooms compile with the headers of every room they may use"
# One build of every room's probes (a target per room), going on after errors (make -k): each probe
# must fail, not finding the header.
"$cmake" --build "$build" --target "${probe_targets[@]}" -- -k > "$log" 2>&1 && { echo "FAIL: the probes compiled"; exit 1; }
fails=0
for p in "${probes[@]}"; do
  if ! grep -q "$p.cpp:.*No such file or directory" "$log"; then
    echo "FAIL: $p did not fail with a missing header:"; grep -A3 "$p" "$log" | head -8; fails=$((fails + 1))
  fi
done
[ "$fails" = 0 ] || exit 1
echo "ok: ${#probes[@]} includes of rooms a room may not use fail to compile (header not found), e.g.:"
grep -m1 "probe_model_includes_train.cpp:.*No such file" "$log"
