#!/usr/bin/env bash
# One call on a GPU node: probe it twice (the second run shows which figures
# re-measure within their spread), check the figures against a PyTorch copy,
# disassemble the probe kernels, run the probe GPU tests. Results go to $OUT. The GPU's entry is
# hwdb/<its entry>.toml, found (or created) as `doit probe` finds it: by name and compute capability.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
entry=$(python3 -c "from aicg.probe import record; from aicg.runtime import driver; d = driver.probe_device()
print(record.entry_for('hwdb', d.name, d.compute_capability) if d else '')")
[ -n "$entry" ] || { echo "no CUDA GPU here"; exit 1; }
echo "entry: $entry" | tee -a "$OUT/gpu.txt"
timeout 200 python3 -m doit probe 2>&1 > "$OUT/probe1.log"; grep -v "^  [a-zA-Z,]" "$OUT/probe1.log" | head -5
grep "(new)\|(changed)\|(within\|note:\|^\.\|Error\|FAILED" "$OUT/probe1.log" | cut -c1-160 | tail -90
cp "$entry" "$OUT/probe1.toml"
timeout 200 python3 -m doit probe > "$OUT/probe2.log" 2>&1
echo "re-probe: $(grep -c '(within spread)' "$OUT/probe2.log") within spread, $(grep -c '(changed)' "$OUT/probe2.log") changed:"
grep "(changed)" "$OUT/probe2.log"
cp "$entry" "${entry%.toml}.curves.json" "$OUT/" 2>/dev/null
timeout 100 python3 tests/bench/probe_check.py "$entry" "$OUT" 2>&1 | tail -14
timeout 120 python3 -m pytest -m gpu tests/test_gpu_probe.py -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -6
