#!/usr/bin/env bash
# The GPU runs that work of 2026-12-05 and 2026-12-06 still waits for (that day's device time ran out; every number it recorded is an
# H100's), in about two device calls: each script checks its kernels against the exact Torch kernel and float64
# before timing, and writes its report under $OUT. From the repository root on the device:
#     bash benchmarks/gpu_pending.sh
# Copy $OUT/*.md to benchmarks/results/h200-<name>-<date>.md and the numbers into docs/performance.md.
set -u
export PYTHONPATH="$PWD/src:$PWD/benchmarks"
OUT="${OUT:-/tmp/gpu_pending}"
mkdir -p "$OUT"
export OUT
status=0
only=" $* "  # step names to run (all when none given): bash benchmarks/gpu_pending.sh gpu_exl2 e2e_decoder
run() {  # name, time limit (s), command...
    local name=$1 limit=$2
    shift 2
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
    echo "=== $name"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "$name failed ($?)"; status=1; }
    tail -n 5 "$OUT/$name.log"
}
# pytest for the thread test, from wheels carried in .whl/ where the image has none (pip download -d .whl pytest gguf)
python -c "import pytest" 2>/dev/null || { [ -d .whl ] && python -m pip install -q --no-index --find-links .whl pytest; }
# gguf-py for the GGUF conformance oracle (pure Python; numpy and pyyaml are on the image)
python -c "import gguf" 2>/dev/null || { [ -d .whl ] && python -m pip install -q --no-deps --no-index --find-links .whl gguf; }
# EXL2 on the GPTQ Triton kernels (Exl2TritonLinear) and ExLlamaV2's act-order gather in one launch: ran on an H100
# for 4096x14336 only (results/h100-gpu-exl2-triton-2026-12-07.md); both shapes, and the H200's own numbers
run gpu_exl2 240 python benchmarks/gpu_exl2.py --reps 15 --sweep
# the whole conformance report on one tree (earlier runs covered every kernel, but across three calls) and the
# GPTQ variant sweep to its end (a 170 s limit stopped it inside the 2-bit layers on 2026-12-05)
run conformance_cuda 200 python benchmarks/gpu_check.py --conformance
# all bits in one step as 15 shard processes (69 s on an H100 host of 16 cores, 2026-12-06; one process took
# 200-300 s a bits)
run gpu_check 300 python benchmarks/gpu_check.py --jobs 15 --bits 2,4,8 --budget 260 --out "$OUT/gpu_check.md"
# 8-bit gemv_tc against the shipped variants on the H200 (its table's 8-bit crossovers predate 8-bit gemv_tc)
run gemv_tc8_rows 90 python benchmarks/gemv_tc8_rows.py --shapes 4096x14336,8192x28672,4096x4096,14336x4096
# gemv_tc at M=1 on the 4-bit g32 forms with offsets (GGUF Q4_K, MLX g32): on the H100, Q4_K took 32.0 us on
# 14336x4096 against 21.3 on 4096x14336 (results/h100-gguf_crossover-2026-12-06.md) and MLX g32 35.0 against 21.4,
# where 4-bit g128 takes about 17; the g32 configs come from the heuristic, not from a sweep (added 2026-12-07, not
# yet run: the session's device time ran out; an H100 run on 2026-12-07 got four rows in 200 s:
# results/h100-gemv_tc_affine-2026-12-07-partial.md)
run gemv_tc_affine 400 python benchmarks/gemv_tc_sweep.py --no-check --bits "" --affine 14336x4096,4096x14336 \
    --forms kquant,bf16g32
# the one table key those forms share with GPTQ g32 (m=1, 14336x4096: no offsets field): the offset sweep's best
# configs on all four forms, GPTQ sym/asym g32, Q4_K, MLX g32 (added 2026-12-07, third session)
run gemv_tc_g32_key 330 python benchmarks/gemv_tc_g32_key.py
# MLX on the GPTQ Triton kernels (MlxTritonLinear): checks per variant, gemm5 over groups of 64/128 with offsets
# (its one-group step dropped them before 2026-12-07) and on 8-bit words with offsets (5/6/8-bit MLX), and timings
# beside bf16 and MlxTorchLinear (ran on an H100 on 2026-12-07: results/h100-gpu_mlx-2026-12-07-gemm5.md)
run gpu_mlx 330 python benchmarks/gpu_mlx.py --reps 20 --ms 1,16,64,256,1024,4096 \
    --forms 4x64,4x128,4x32,8x64,8x32,6x64 --variants gemm5,dense
# gemm5 on every 4 and 8-bit form after that change (GPTQ, GGUF: their paths without offsets are unchanged)
run gemm5_check 150 python benchmarks/gpu_check.py --jobs 15 --bits 4,8 --forms --variants gemm5 --budget 110 \
    --out "$OUT/gemm5_check.md"
# the same cells on an H200 (every number of 2026-12-05 is an H100's)
run gpu_exl3 120 python benchmarks/gpu_exl3.py --ms 1,2,4,8,16,32,64,256
run gpu_paroquant 90 python benchmarks/gpu_paroquant.py
run gpu_gguf_dense 90 python benchmarks/gpu_gguf_dense.py
# GGUF on the GPTQ kernels by default (Q4_K's two-level form, Q8_0 as 8-bit g32; 2026-12-06): ran on an H100
# (results/h100-gguf_crossover-2026-12-06.md); the H200's own, and the offset crossovers (gemv_tc 16, skinny2 32,
# gemm2 64, dense above) checked in the default-layer column
run gguf_crossover 360 python benchmarks/gguf_crossover.py --qtypes Q4_K,Q8_0
run e2e_decoder 300 python benchmarks/e2e_decoder.py --variants bf16,gptq4,int8,q4_k,q8_0
# the same model as a serving engine lays it out (fused qkv / gate_up, one launch per elementwise step; 2026-12-07)
run e2e_fused 300 python benchmarks/e2e_decoder.py --fused --variants bf16,gptq4,int8,q4_k
run e2e_profile_fused 150 python benchmarks/e2e_profile.py --fused --variants bf16,gptq4
# gemm5 over groups of 32 and on 8-bit words (2026-12-06, H100 only): the H200's own numbers, and its table's
# 8-bit crossovers (unchanged: no gemm5) against the H100's (gemm5 M = 9..1024)
run gemm5_g32 150 python benchmarks/gemm5_g32.py --ms 16,64,256,1024
run gemm5_8bit 150 python benchmarks/gemm5_g32.py --bits 8 --group 128 --ms 16,32,64,128,256,512,1024
run gguf_q8 120 python benchmarks/gguf_crossover.py --qtypes Q8_0 --ms 8,16,32,64,128,256,512,1024
# EXL3 and VPTQ against their producers' own CUDA kernels (issue 24: "faster than their own project's kernel"), built
# on the device from their sources, which travel in .peers/ (ignored; carry it):
#     pip download --no-deps exllamav3==1.6.5 -d /tmp/w && unzip -q -o /tmp/w/exllamav3-1.6.5-py3-none-any.whl \
#         'exllamav3/exllamav3_ext/*' -d /tmp/w && mkdir -p .peers && cp -r /tmp/w/exllamav3/exllamav3_ext .peers/
#     git clone -q https://github.com/microsoft/VPTQ /tmp/VPTQ && mkdir -p .peers/vptq && cp -r /tmp/VPTQ/csrc .peers/vptq/
# (first run on an H100 on 2026-12-07, later session: results/h100-gpu_producer_kernels-2026-12-07.md; the H200's own)
[ -d .peers/exllamav3_ext ] && [ -d .peers/vptq/csrc ] && run producer_kernels 300 python \
    benchmarks/gpu_producer_kernels.py --exl3-src .peers/exllamav3_ext --vptq-src .peers/vptq/csrc --ms 1,4 --reps 20
# the EXL3 GEMV over smaller launches and larger K splits (ran on an H100 on 2026-12-07 and set exl3_gemv.LAUNCH /
# PROGRAMS_PER_SM: results/h100-gpu-exl3-splits-2026-12-07.md); the H200's own
run exl3_splits 150 python benchmarks/gpu_exl3_parts.py --no-transforms --shapes 4096x14336 --bits 2,4 --splits 1,4
# EXL3 mul1's byte sum as one dp4a on CUDA (2026-12-07, third session; offline SASS 12.8 -> 8.4 instructions per
# weight): bit-exact decode at every width and codebook, then the codebooks' GEMV times against
# results/h100-gpu-exl3-codebooks-2026-12-07.md (2-bit mul1 39.5 us, 3inst 31.9 on 4096x14336)
run exl3_decode_check 60 python benchmarks/gpu_exl3_decode_check.py
run exl3_codebooks 200 python benchmarks/gpu_exl3_parts.py --no-transforms --shapes 4096x14336,14336x4096 \
    --bits 2,3,4 --codebooks 3inst,mcg,mul1 --rule
# EXL3's few-row GEMV: exllamav3's costs what one row does at M = 4 (31-40 us), qlinear's 48-57 (2026-12-07, H100,
# results/h100-gpu_producer_kernels-2026-12-07.md); launches of 2 / 4 rows a program over the M = 1 sweep's shapes
run exl3_rows 150 python benchmarks/gpu_exl3_parts.py --no-transforms --shapes 4096x14336,14336x4096 --bits 4,2 --m 4 \
    --splits 1,2 --row-blocks 4,2
# EXL3's block decode in stream order (2026-12-07, fourth session): the fused kernel over blocks and warps and the
# decode + matmul route. Ran on an H100 for 4096x14336 at M = 1, 4, 16, 64, 256 (results/h100-gpu_exl3_block-2026-12-07.md),
# which set exl3_mv's FUSED_MAX_M / BLOCK_*; since 2026-12-08 M <= 32 go to exl3_tc, so what is left to time is the
# fused kernel's own range (33..64) and the crossover to decode + matmul, on both shapes and the H200
run exl3_block 300 python benchmarks/gpu_exl3_block.py --ms 33,48,64,96,128 --no-check
# EXL3 decoded straight into mma fragments (exl3_tc.py, Gluon; 2026-12-08): every width x codebook against float64 and
# bit for bit through identity rows, with the paired codebook PTX (exl3_tc.PAIRS, off until this passes) and without,
# then the launch sweep beside the GEMV and the fused kernel, paired against plain (the first sweep, without the
# paired form, ran on an H100: results/h100-gpu_exl3_tc-2026-12-08.md). If every check passes and paired is faster,
# set PAIRS = True
run exl3_tc 300 python benchmarks/gpu_exl3_tc.py --check-ms 3 --ms 1,4,16,32
# EXL3 decoded into wgmma A fragments, x by TMA (exl3_wg.py, Gluon, sm_90; 2026-12-08, written and compiled offline,
# never run: the device stopped lending): bit-exact and float64 checks at every width x codebook, then the launch
# sweep at M = 48..256 beside the fused kernel and decode + matmul. If it wins, route M > exl3_mv.TC_MAX_M to it in
# exl3_mv.inner_product (up to the M where decode + matmul wins) and set exl3_wg.LAUNCH / PROGRAMS_PER_SM
run exl3_wg 330 python benchmarks/gpu_exl3_wg.py
exit $status
