#!/usr/bin/env bash
# One call on a GPU node: build the default instance (validating and timing
# every candidate), run the GPU tests, and compare with PyTorch. Results go
# to $OUT (or ./device-out). Carried wheels in .whl/ are installed first.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import importlib.metadata as m; print({p: m.version(p) for p in ['nvidia-cuda-nvrtc','cuda-bindings','cuda-core','torch','numpy']})" | tee -a "$OUT/gpu.txt"
python3 -m doit build 2>&1 | tee "$OUT/build.log" | tail -25
cp build/h200-tolerance/manifest.json build/h200-tolerance/report.md "$OUT/" 2>/dev/null
tar czf "$OUT/build-and-cache.tgz" build cache
python3 -m pytest -m gpu ${GPU_TESTS:-tests/test_gpu.py tests/test_gpu_adversarial.py} -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
python3 tests/bench/compare_torch.py build/h200-tolerance "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -45
