#!/usr/bin/env bash
# `make run`: the main job on the embedded default.
set -euo pipefail
BUILD=${1:-build}
"$BUILD/exatrain" version
