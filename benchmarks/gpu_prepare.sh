#!/usr/bin/env bash
# Makes .device/, what benchmarks/gpu_check.sh needs on a GPU machine that has no network: run it here,
# on the development machine (PyPI reachable, ../shared beside the checkout), at the start of a session
# that has a GPU. .device/ is ignored by git (a clone never holds it) and travels with the checkout when
# the device call carries it (carry [".device"]).
#
#   .device/whl/     the wheels the GPU image lacks, for its Python 3.12: the cuDNN frontend, a protobuf at
#                    least as new as netdef_pb2's gencode, lmdb, simplejpeg
#   .device/mpi/     the mpich wheel (the image's mpi4py has no MPI library of its own)
#   .device/shared/  fixtures/caffe-ref and fixtures/caffe-models, as ../shared holds them
#   .device/nccl/    kept when there: NCCL 2.30+ for Hopper, which benchmarks/gpu_nccl.sh builds (then
#                    two ranks on the machine's one GPU can sum over NCCL)
#
# Usage: bash benchmarks/gpu_prepare.sh [PATH_TO_SHARED]    (default: ../shared beside the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED="${1:-../shared}"
# What travels to a GPU machine is at most 64 MiB, the checkout included.
LIMIT_MIB=64

grep -qxF "/.device/" .git/info/exclude 2>/dev/null || echo "/.device/" >> .git/info/exclude
# Everything but .device/nccl/, a build of NCCL that gpu_nccl.sh takes ten minutes to make.
mkdir -p .device
find .device -mindepth 1 -maxdepth 1 ! -name nccl -exec rm -rf {} +
mkdir -p .device/whl .device/mpi .device/shared/fixtures

download() {
  local into="$1"; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$into" "$@"
}
# The versions measured on the H200 (benchmarks/README.md, "The first GPU figures"); lmdb and simplejpeg
# have no pin: any recent release reads and decodes what netdef writes.
download .device/whl nvidia-cudnn-frontend==1.32.0 protobuf==7.35.1 lmdb simplejpeg
download .device/mpi mpich

for fixtures in caffe-ref caffe-models; do
  if [ -d "$SHARED/fixtures/$fixtures" ]; then
    cp -r "$SHARED/fixtures/$fixtures" .device/shared/fixtures/
  else
    echo "no $SHARED/fixtures/$fixtures: the GPU tests that compare with Caffe's outputs will skip there" >&2
  fi
done

tree_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
device_kib=$(du -sk .device | cut -f1)
total_mib=$(( (tree_kib + device_kib) / 1024 ))
ls -1 .device/whl .device/mpi
echo ".device: $((device_kib / 1024)) MiB; with the checkout $total_mib MiB of the $LIMIT_MIB MiB that may travel"
if [ "$total_mib" -ge "$LIMIT_MIB" ]; then
  echo "too large to travel to a GPU machine: leave out caffe-models or a wheel" >&2
  exit 1
fi
