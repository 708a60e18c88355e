export PYTHONPATH=$PWD/src:$PWD/benchmarks
python -m pip install -q --no-deps --no-index --find-links .whl gguf pytest iniconfig pluggy packaging pygments 2>&1 | tail -1
(timeout 200 python benchmarks/gpu_check.py --forms --out $OUT/forms.md > $OUT/forms.log 2>&1; echo "forms rc=$?" >> $OUT/forms.log) &
timeout 200 python benchmarks/gpu_check.py --jobs 14 --bits 4 --full --variants gemm5,auto --budget 170 --out $OUT/g5.md > $OUT/g5.log 2>&1; echo "g5 rc=$?"
wait
tail -3 $OUT/forms.log; tail -2 $OUT/g5.log
timeout 100 python benchmarks/gemm5_g32_parts.py --ms 16,64 > $OUT/parts.md 2>&1; echo "parts rc=$?"; cat $OUT/parts.md | tail -14
timeout 150 python benchmarks/gemm5_g32.py --ms 16,64,256,1024,2048 > $OUT/gemm5_g32.md 2>&1; echo "g32 rc=$?"; cat $OUT/gemm5_g32.md
timeout 170 python benchmarks/gguf_crossover.py --qtypes Q4_K --ms 8,16,32,64,128,256,512,1024,2048 > $OUT/gguf_crossover.md 2>&1; echo "crossover rc=$?"
cut -d'|' -f2-5,12-20 $OUT/gguf_crossover.md
timeout 200 python benchmarks/e2e_decoder.py --variants bf16,q4_k > $OUT/e2e.md 2>&1; echo "e2e rc=$?"; tail -6 $OUT/e2e.md
