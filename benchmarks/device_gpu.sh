#!/usr/bin/env bash
# The whole GPU check, as one call on a lent H200 (its python3 has torch, Triton, cuda-python and
# pytest; recperf runs from the source tree):
#   run: bash benchmarks/device_gpu.sh      (timeout_s 560; results come back from $OUT)
# 1. the GPU tests, compiled Triton (TRITON_INTERPRET=0): every kernel vs the reference on CUDA in
#    every row format it reads (fp32, fp16, bf16, fp8, int8, int4), the L2 window read back
#    through cuda-python, the stall profiler's CUDA-event clock;
# 2. benchmarks/embed_gpu.py, its JSON saved after every step (a cut-short run keeps its figures):
#    the variants tuned on the reuse trace (fp32), then every row format x Triton variant as bytes
#    moved against the measured copy bandwidth, then the other traces while time is left.
# The tests compile each kernel in six row formats (Triton caches them on disk, and the
# benchmark's device check runs the same cases), hence their larger share of the time.
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$out/gpu.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/embed/test_kernels.py \
  tests/embed/test_hotrows.py tests/stalls/test_profiler.py 2>&1 \
  | tee "$out/gpu_tests.txt" | tail -15
timeout 330 python3 benchmarks/embed_gpu.py --out "$out/embed_gpu.json" 2>&1 | tee "$out/embed_gpu.log"
