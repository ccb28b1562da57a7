#!/bin/sh
# Downloads the wheels of benchmarks/gpu_wheels.txt for the lent GPU machine (CPython 3.12,
# x86_64 Linux; it cannot download) into gpu_wheels/ (git-ignored), which the device tool carries
# and benchmarks/gpu_check.sh installs from with --no-index. --no-deps: the list is the whole of
# what that machine lacks. About 1.4 MB; the carry limit is 64 MiB.
set -eu
cd "$(dirname "$0")/.."
mkdir -p gpu_wheels
pip download --quiet --dest gpu_wheels --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -r benchmarks/gpu_wheels.txt
ls -l gpu_wheels
du -sh gpu_wheels
