#!/usr/bin/env bash
# Builds NCCL 2.30 or later from source into .device/nccl/libnccl.so.2, for the GPU machines' two-rank
# NCCL runs (issue 30): those machines have one GPU, and the NCCL their image has (2.28.9) refuses two
# ranks of one communicator on one GPU; NCCL 2.30 allows it with NCCL_MULTI_RANK_GPU_ENABLE=1. NVIDIA's
# wheel of a newer NCCL is 252 MB, four times what may travel, because it holds device code for every
# GPU generation and every collective. This build holds what netdef runs on the GPU machines: Hopper
# (sm_90: H100 and H200) and the sums netdef asks for (allreduce, float16/32/64; send/receive), about
# 7 MB once stripped. benchmarks/gpu_check.sh preloads it where it exists.
#
# Run it here, on the development machine (nvcc is here; ten minutes on two cores), after
# gpu_prepare.sh (which keeps .device/nccl/), with a checkout of https://github.com/NVIDIA/nccl at
# v2.30 or later:
#
#   bash benchmarks/gpu_nccl.sh PATH_TO_NCCL_SOURCE [CUDA_HOME]
set -euo pipefail
cd "$(dirname "$0")/.."
SOURCE="$(cd "${1:?usage: gpu_nccl.sh PATH_TO_NCCL_SOURCE [CUDA_HOME]}" && pwd)"
CUDA_HOME="${2:-${CUDA_HOME:-/usr/local/cuda}}"
BUILD="${NCCL_BUILD_DIR:-/tmp/netdef-nccl-build}"

version=$(sed -n 's/^NCCL_\(MAJOR\|MINOR\|PATCH\) *:= *//p' "$SOURCE/makefiles/version.mk" | paste -sd.)
case "$version" in
  2.[0-9].*|2.1[0-9].*|2.2[0-9].*) echo "NCCL $version in $SOURCE: two ranks on one GPU take 2.30 or later" >&2; exit 1 ;;
esac
echo "building NCCL $version for sm_90 (H100, H200) into $BUILD"
make -C "$SOURCE" -j "$(nproc)" src.build BUILDDIR="$BUILD" CUDA_HOME="$CUDA_HOME" \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
  ONLY_FUNCS="AllReduce Sum (f16|f32|f64) * *|SendRecv" > "$BUILD.log" 2>&1 \
  || { tail -20 "$BUILD.log" >&2; exit 1; }
mkdir -p .device/nccl
# Only the symbols go: the device code stays (readelf -S shows .nv_fatbin).
strip --strip-unneeded -o .device/nccl/libnccl.so.2 "$BUILD/lib/libnccl.so.$version"
echo "$version" > .device/nccl/VERSION
echo ".device/nccl/libnccl.so.2: NCCL $version, $(du -h .device/nccl/libnccl.so.2 | cut -f1)"
