#!/bin/sh
# The checks of a lent GPU machine in one call (benchmarks/gpu_check.py says what each is):
#
#     sh benchmarks/gpu_check.sh "$OUT" [--device cuda:0] [more benchmarks.gpu_check flags]
#
# results.jsonl and the logs go to the folder given first. Packages that machine lacks are
# installed offline from gpu_wheels/ (made here by benchmarks/gpu_wheels.sh, carried along) into
# a folder of their own, only where an import fails (a CPU run here installs nothing); without
# pip there, the wheels are unpacked (a wheel is a zip of what site-packages would hold).
set -eu
cd "$(dirname "$0")/.."
out=$1
shift
mkdir -p "$out"
py=$(command -v python3 || command -v python)
deps="${TMPDIR:-/tmp}/stepserve-gpu-deps"
export PYTHONPATH="$PWD:$deps${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import zmq, msgspec, tqdm, prometheus_client, jinja2" 2>/dev/null; then
    if "$py" -m pip --version >/dev/null 2>&1; then
        "$py" -m pip install --quiet --no-index --find-links gpu_wheels --target "$deps" \
            -r benchmarks/gpu_wheels.txt >"$out/pip.log" 2>&1 || { cat "$out/pip.log"; exit 1; }
    else
        "$py" -c "import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob('gpu_wheels/*.whl')]" "$deps"
    fi
fi
status=0
"$py" -m benchmarks.gpu_check --out "$out" "$@" 2>"$out/gpu_check.log" || status=$?
[ "$status" -eq 0 ] || tail -n 40 "$out/gpu_check.log"
exit "$status"
