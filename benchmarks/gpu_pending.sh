#!/usr/bin/env bash
# Every H200 run that work since 2026-12-05 waits for (no GPU was lent to the session that built it), in one device
# call of about 8 minutes: each script checks its kernels against the exact Torch kernel and float64 before timing,
# and writes its report under $OUT. From the repository root on the device:
#     bash benchmarks/gpu_pending.sh
# Copy $OUT/*.md to benchmarks/results/h200-<name>-<date>.md and the numbers into docs/performance.md.
set -u
export PYTHONPATH="$PWD/src:$PWD/benchmarks"
OUT="${OUT:-/tmp/gpu_pending}"
mkdir -p "$OUT"
export OUT
status=0
run() {  # name, time limit (s), command...
    local name=$1 limit=$2
    shift 2
    echo "=== $name"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "$name failed ($?)"; status=1; }
    tail -n 5 "$OUT/$name.log"
}
# pytest for the thread test, from wheels carried in .whl/ where the image has none (pip download -d .whl pytest gguf)
python -c "import pytest" 2>/dev/null || { [ -d .whl ] && python -m pip install -q --no-index --find-links .whl pytest; }
# gguf-py for the GGUF conformance oracle (pure Python; numpy and pyyaml are on the image)
python -c "import gguf" 2>/dev/null || { [ -d .whl ] && python -m pip install -q --no-deps --no-index --find-links .whl gguf; }
# issue 23: every declared combination of the CUDA kernels against float64, and one layer on 8 CUDA streams
run conformance_cuda 150 python benchmarks/gpu_check.py --conformance
run threads_cuda 60 python -m pytest -q tests/test_thread_safety.py -k cuda
# the EXL3 M = 1 launch sweep (prefetch, tiles per program, warps) and the two transforms timed alone
run gpu_exl3_parts 200 python benchmarks/gpu_exl3_parts.py
# issue 24: the fast paths of the new formats (checks, then time vs bf16 cuBLAS at M = 1 .. 256)
run gpu_exl3 120 python benchmarks/gpu_exl3.py
run gpu_vptq 120 python benchmarks/gpu_vptq.py
run gpu_paroquant 90 python benchmarks/gpu_paroquant.py
run gpu_exl2 90 python benchmarks/gpu_exl2.py
run gpu_bitblas 90 python benchmarks/gpu_bitblas.py
exit $status
