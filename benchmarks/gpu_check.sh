#!/bin/sh
# The checks of a lent GPU machine in one call (benchmarks/gpu_check.py says what each is):
#
#     sh benchmarks/gpu_check.sh "$OUT" [--device cuda:0] [more benchmarks.gpu_check flags]
#
# results.jsonl and the log go to the folder given first. Packages that machine lacks are
# installed, offline, from gpu_wheels/ (made here by benchmarks/gpu_wheels.sh, carried along)
# into a folder of their own, only where an import fails (a CPU run here installs nothing).
set -eu
cd "$(dirname "$0")/.."
out=$1
shift
mkdir -p "$out"
deps="${TMPDIR:-/tmp}/stepserve-gpu-deps"
export PYTHONPATH="$PWD:$deps${PYTHONPATH:+:$PYTHONPATH}"
if ! python -c "import zmq, msgspec, tqdm, prometheus_client, jinja2" 2>/dev/null; then
    python -m pip install --quiet --no-index --find-links gpu_wheels --target "$deps" \
        -r benchmarks/gpu_wheels.txt >"$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
fi
status=0
python -m benchmarks.gpu_check --out "$out" "$@" 2>"$out/gpu_check.log" || status=$?
[ "$status" -eq 0 ] || tail -n 40 "$out/gpu_check.log"
exit "$status"
