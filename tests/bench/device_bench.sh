#!/usr/bin/env bash
# One call on a GPU node: optionally re-measure the realisation profile, build
# instances (validating and timing their candidates), then benchmark them against
# their peers (tests/bench/test_memory_bound.py).
#   PRIMITIVES_SECONDS=540   (run `doit primitives family=rows` first; the new profile is copied to $OUT, or, if
#                             stopped, hwdb/<gpu>.realisation.partial.json: carry it back to resume)
#   PROFILES="rulesets/profiles/default.toml rulesets/profiles/fused.toml"
#   TARGET=auto              (each profile built for this GPU's hwdb entry: `doit build target=auto`; or an
#                             entry's name; TARGET= builds each profile for its own target)
#   GPU_TESTS="tests/test_gpu.py ..."  GRID_SECONDS=300  GRID_SELECT="4194304x1 or 1x65536" (a -k expression)
#   FLUSHES="read write"     (each bench once per L2 flush, AICG_BENCH_FLUSH: test_memory_bound.py's docstring)
#   FIRST_CALL_SECONDS=180   (tests/bench/first_call.py on the first profile's instance: the JIT's first result
#                             of untuned shapes beside Triton's; $OUT/first_call.json)
#   PHASES="rmsnorm_tree.bfloat16.t512.v16.block.c4 ..."  PHASES_SHAPE=1x4096   (tests/bench/phases.py first)
#   CHECK="ID ..."  CHECK_KERNELS="trials/<commit>/kernels ..."  CHECK_FLAGS="--quick --same-bits"
#                            (then check_candidates.py: each ID built with kernels/ and each trial's headers,
#                             made here by tests/bench/trial_kernels.sh and carried; checked, timed side by side)
# Results go to $OUT (or ./device-out): the realisation profile, the bench JSONs, instances.tgz and
# logs.tgz (every log, refreshed after each step), no more than six files, so that a node that
# returns few files returns them all. Carried wheels in .whl/ are installed first.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
PROFILES=${PROFILES:-rulesets/profiles/default.toml}
TARGET=${TARGET-auto}
if [ -n "${PHASES:-}" ]; then
  timeout "${PHASES_SECONDS:-120}" python3 tests/bench/phases.py --shape "${PHASES_SHAPE:-1x4096}" $PHASES 2>&1 | tee "$LOGS/phases.log"
  keep_logs
fi
if [ -n "${CHECK:-}" ]; then
  dirs=(--kernels kernels)
  for k in ${CHECK_KERNELS:-}; do dirs+=(--kernels "$k"); done
  timeout "${CHECK_SECONDS:-240}" python3 tests/bench/check_candidates.py "${dirs[@]}" ${CHECK_FLAGS:-} \
    ${CHECK_SHAPES:+--shapes "$CHECK_SHAPES"} $CHECK 2>&1 | tee "$LOGS/check.log"
  keep_logs
fi
if [ "${PRIMITIVES_SECONDS:-0}" -gt 0 ]; then
  timeout "$PRIMITIVES_SECONDS" python3 -m doit primitives family=rows 2>&1 | tee "$LOGS/primitives.log" | tail -45
  cp hwdb/*.realisation*.json "$OUT/" 2>/dev/null
  keep_logs
fi
instances=()
for profile in $PROFILES; do
  # the instance's name as the build gives it (aicg/target.py: <target>-<profile stem> for another target)
  name=$(python3 -c "import sys; from aicg import target as t
print(t.instance_of(sys.argv[1], sys.argv[2] and t.resolve(sys.argv[2], 'hwdb', t.present_device())))" \
    "$profile" "$TARGET") || exit 1
  timeout "${BUILD_SECONDS:-400}" python3 -m doit build profile="$profile" target="$TARGET" 2>&1 | tee "$LOGS/build-$name.log" | tail -25
  cp "build/$name/manifest.json" "$LOGS/manifest-$name.json" 2>/dev/null
  instances+=("build/$name")
  keep_logs
done
tar czf "$OUT/instances.tgz" "${instances[@]}"
instance=$(IFS=,; echo "${instances[*]}")
bench() {   # bench SUITE SECONDS [-k EXPRESSION]: stopped at the limit; the JSON holds every case finished by then
  for flush in ${FLUSHES:-read}; do
    AICG_BENCH_FLUSH=$flush AICG_INSTANCE=$instance AICG_BENCH_JSON="$OUT/bench-$1-$flush.json" timeout -s INT "$2" \
      python3 -m pytest -m gpu tests/bench/test_memory_bound.py -k "$1${3:+ and ($3)}" -q -p no:cacheprovider \
      --benchmark-disable-gc --benchmark-columns=median,iqr,rounds 2>&1 | tee "$LOGS/bench-$1-$flush.log" | grep -v "^test_memory_bound\|^---\|^Name\|^$" | tail -60
    keep_logs
  done
}
bench acceptance "${ACCEPTANCE_SECONDS:-120}"
if [ "${FIRST_CALL_SECONDS:-0}" -gt 0 ]; then
  timeout "$FIRST_CALL_SECONDS" python3 tests/bench/first_call.py "${instances[0]}" --json "$OUT/first_call.json" 2>&1 \
    | tee "$LOGS/first_call.log" | tail -20
  keep_logs
fi
if [ -n "${GPU_TESTS:-}" ]; then
  timeout "${GPU_TEST_SECONDS:-200}" python3 -m pytest -m gpu $GPU_TESTS -q -p no:cacheprovider 2>&1 | tee "$LOGS/gpu_tests.log" | tail -15
  keep_logs
fi
# an if, not an &&: a run without the grid ends with the status of what ran, not of the test
if [ "${GRID_SECONDS:-0}" -gt 0 ]; then bench grid "$GRID_SECONDS" "${GRID_SELECT:-}"; fi
