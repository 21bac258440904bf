#!/usr/bin/env bash
# Regenerates corpus/kjv.txt.xz from Debian's bible-kjv-text package (the King James Version,
# 1611, public domain; see corpus/README.md). One verse per line, the "Ge1:1 " reference removed.
# Run as: apt-get install bible-kjv bible-kjv-text && corpus/make_kjv.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# `bible` finds its data in /usr/lib; -f turns pretty-printing off (one verse per line).
(cd /usr/lib && bible -f "Gen1:1-Rev22:21") \
  | sed -E 's/^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ //' \
  | xz -9e --threads=1 > "$here/kjv.txt.xz"
xz -dc "$here/kjv.txt.xz" | wc -l -c
