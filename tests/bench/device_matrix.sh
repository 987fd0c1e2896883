#!/usr/bin/env bash
# One call on a GPU node for the matrix family: its GPU tests, the matrix lab (the GPU's matrix
# profile), the matmul profile's build for this GPU on that profile, and the benchmark's stages.
# Each step has a time limit of its own and the call goes on after one fails.
#   GPU_TESTS="tests/test_gpu_matrix_build.py tests/test_gpu_matrix_lab.py"   GPU_TEST_SECONDS=200
#   LAB_SECONDS=180          (doit primitives family=matrix budget=...: the profile lands in $OUT; 0: skip)
#   BUILD_SECONDS=240        (doit build profile=rulesets/profiles/matmul.toml target=auto; 0: skip)
#   BENCH="--stages grid --grid-nk 4096x4096,4096x14336"   (each shape: the prior's first 4 and the first tried)
#   BENCH_SECONDS=240        (tests/bench/matmul_bench.py with BENCH's arguments; empty BENCH: skip)
#   FUSED="--schedules 0,5 --epilogues 0,3"   (tests/bench/fused_epilogue.py's arguments besides --json;
#                             FUSED_SECONDS, default 200; empty FUSED: skip)
#   RECALIBRATE="docs/bench/RUN.json ..."   (the GPU's matrix profile, hwdb/<gpu>.matrix.json, written again
#                             from these runs and this call's bench run, before the record: to $OUT)
#   RECORD=1                 (doit record of the matmul profile: hwdb/<gpu>.validations.jsonl to $OUT;
#                             RECORD_SECONDS, default 300: past it, what was validated is recorded)
# Results go to $OUT (or ./device-out): the matrix profile, the bench JSON, the fused epilogue's JSON,
# the build's manifest and report, and logs.tgz (every log, refreshed after each step). Carried wheels in .whl/ are installed first.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
entry=$(hwdb_entry) || exit 1
echo "hwdb entry: $entry" | tee -a "$LOGS/gpu.txt"

GPU_TESTS=${GPU_TESTS-tests/test_gpu_matrix_build.py tests/test_gpu_matrix_lab.py}
if [ -n "$GPU_TESTS" ]; then
  timeout "${GPU_TEST_SECONDS:-200}" python3 -m pytest -m gpu $GPU_TESTS -q -p no:cacheprovider 2>&1 \
    | tee "$LOGS/gpu_tests.log" | tail -15
  keep_logs
fi
if [ "${LAB_SECONDS:-180}" -gt 0 ]; then
  # the budget is the lab's own; the timeout leaves it room to write the profile
  timeout $(( ${LAB_SECONDS:-180} + 60 )) python3 -m doit primitives family=matrix budget="${LAB_SECONDS:-180}" 2>&1 \
    | tee "$LOGS/matrix_lab.log" | tail -8
  cp "hwdb/$entry.matrix.json" "$OUT/" 2>/dev/null
  keep_logs
fi
if [ "${BUILD_SECONDS:-240}" -gt 0 ]; then
  name=$(python3 -c "from aicg import target as t; print(t.instance_of('rulesets/profiles/matmul.toml', '$entry'))")
  timeout "${BUILD_SECONDS:-240}" python3 -m doit build profile=rulesets/profiles/matmul.toml target=auto 2>&1 \
    | tee "$LOGS/build-matmul.log" | tail -30
  cp "build/$name/manifest.json" "$OUT/manifest-$name.json" 2>/dev/null
  cp "build/$name/report.md" "$OUT/report-$name.md" 2>/dev/null
  cp "build/$name/plan/matmul.json" "$LOGS/plan-$name.json" 2>/dev/null
  keep_logs
fi
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_SECONDS:-240}" python3 tests/bench/matmul_bench.py --json "$OUT/matmul.json" \
    --budget "$(( ${BENCH_SECONDS:-240} - 20 ))" $BENCH 2>&1 | tee "$LOGS/matmul_bench.log" | tail -40
  keep_logs
fi
if [ -n "${FUSED:-}" ]; then
  timeout "${FUSED_SECONDS:-200}" python3 tests/bench/fused_epilogue.py --json "$OUT/fused.json" $FUSED 2>&1 \
    | tee "$LOGS/fused.log" | grep -v Warning | tail -30
  keep_logs
fi
if [ -n "${RECALIBRATE:-}" ]; then
  python3 tests/bench/matmul_profile.py $RECALIBRATE $( [ -s "$OUT/matmul.json" ] && echo "$OUT/matmul.json" ) \
    --out "hwdb/$entry.matrix.json" --driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader)" 2>&1 \
    | tee "$LOGS/recalibrate.log" | tail -5
  cp "hwdb/$entry.matrix.json" "$OUT/" 2>/dev/null
  keep_logs
fi
if [ "${RECORD:-0}" = 1 ]; then
  record_profile rulesets/profiles/matmul.toml "${RECORD_SECONDS:-300}" "$LOGS/record.log"
  cp "hwdb/$entry.validations.jsonl" "$OUT/" 2>/dev/null
  keep_logs
fi
