#!/usr/bin/env bash
# bench/gpu/bundle.sh BUILD OUT.tar.xz: pack a CUDA build's binaries with the shared libraries they
# need, for a GPU machine that has the CUDA driver but not this project's Debian packages (docs/cuda.md
# "Running on a machine without the build's packages"). bench/gpu/run.sh unpacks it with
# EXA_BUNDLE=OUT.tar.xz instead of building.
#   bin/   exatrain, test_backend, test_model, bench_gpu from BUILD
#   lib/   every library ldd resolves for them, except the C runtime (glibc, libstdc++, libgcc_s:
#          the target's own, which are newer on a current distribution) and the CUDA libraries the
#          GPU machine has (NCCL, cuBLASLt: run.sh finds them there; libcudart.so.13 is packed)
#   ompi/  Open MPI's plugins and help files (/usr/lib/<triplet>/openmpi, /usr/share/openmpi): a
#          singleton MPI_Init (`exatrain train` without mpirun) loads its components from there;
#          run.sh puts them back at the same absolute paths when the machine has none.
set -euo pipefail
BUILD=${1:?usage: bundle.sh BUILD OUT.tar.xz}
OUTF=${2:?usage: bundle.sh BUILD OUT.tar.xz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/ompi"
bins=("$BUILD/exatrain" "$BUILD/tests/test_backend" "$BUILD/tests/test_model" "$BUILD/bench/bench_gpu")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "bundle.sh: $b is missing: build exatrain test_backend test_model bench_gpu first" >&2; exit 1; }
  cp "$b" "$stage/bin/"
done
for b in "${bins[@]}"; do  # a library this machine lacks would make an incomplete bundle
  if ldd "$b" | grep "not found"; then echo "bundle.sh: $b needs the libraries above, not found here" >&2; exit 1; fi
done
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libnccl|libcublas)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$stage/lib/$name"
done
triplet=$(gcc -dumpmachine)
cp -a "/usr/lib/$triplet/openmpi" "$stage/ompi/lib-openmpi"
cp -a /usr/share/openmpi "$stage/ompi/share-openmpi"
echo "$triplet" > "$stage/ompi/triplet"
tar -C "$stage" -cJf "$OUTF" bin lib ompi
echo "bundle.sh: $OUTF ($(du -h "$OUTF" | cut -f1)): $(ls "$stage/bin" | tr '\n' ' ')+ $(ls "$stage/lib" | wc -l) libraries + Open MPI's components"
