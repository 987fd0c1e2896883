#!/usr/bin/env bash
# One call on a GPU node: probe it twice (the second run shows which figures
# re-measure within their spread), check the figures against a PyTorch copy,
# disassemble the probe kernels, then run the GPU tests. Results go to $OUT.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
timeout ${PROBE_TIMEOUT:-240} python3 -m doit probe ${PROBES:-} 2>&1 | tee "$OUT/probe1.log" | grep -v "^  [a-zA-Z -]*[0-9.]* *\(KiB\|MiB\|B\|threads\)" | tail -70
cp hwdb/nvidia-h200.toml "$OUT/probe1.toml"
if [ -n "${REPROBE:-}" ]; then
  timeout ${PROBE_TIMEOUT:-240} python3 -m doit probe ${PROBES:-} > "$OUT/probe2.log" 2>&1
  echo "re-probe: $(grep -c '(within spread)' "$OUT/probe2.log") within spread, $(grep -c '(changed)' "$OUT/probe2.log") changed"
fi
cp hwdb/nvidia-h200.toml hwdb/nvidia-h200.curves.json "$OUT/" 2>/dev/null
timeout 120 python3 tests/bench/probe_check.py hwdb/nvidia-h200.toml "$OUT" 2>&1 | tail -20
if [ -n "${GPU_TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu $GPU_TESTS -q -p no:cacheprovider -x 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
fi
