#!/usr/bin/env bash
# One call on a GPU node for the models through an instance: the two blocks through aicg.backend
# beside eager and Inductor (tests/bench/model_bench.py, its instance built for this GPU on the
# first run), their GPU tests, and the backward kernels against PyTorch's. Each step has a time
# limit of its own and the call goes on after one fails.
#   VARIANTS="eager,inductor,aicg"   (default: those and the CUDA graph variants; max-autotune's apart)
#   PROFILE=1                        (model_bench --profile: where each forward's time goes)
#   MODEL_SECONDS=240  HOST_SECONDS=60  TEST_SECONDS=120  BACKWARD_SECONDS=150   (each step's limit,
#                                    570 s in all; 0 skips a step)
#   BACKWARD_ARGS="--ops rmsnorm,layernorm --candidates"   (backward_bench.py's arguments besides --json)
#   AUTOTUNE_SECONDS=500             (the max-autotune variants, apart; 0 by default: a call of its own,
#                                    with the other steps' SECONDS 0, builds the instance it needs)
# Results go to $OUT (or ./device-out): model.json, model-max-autotune.json, host_time.txt
# (tests/bench/host_time.py on the blocks' instance), backward.json, gpu-tests of
# test_gpu_model.py, and logs.tgz. Carried wheels in .whl/ are installed first.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
VARIANTS=${VARIANTS:-eager,inductor,aicg,inductor-reduce-overhead,aicg-reduce-overhead}
if [ "${MODEL_SECONDS:-240}" -gt 0 ]; then
  timeout "${MODEL_SECONDS:-240}" python3 tests/bench/model_bench.py --json "$OUT/model.json" --variants "$VARIANTS" \
    ${PROFILE:+--profile} 2>&1 | tee "$LOGS/model.log" | grep -v Warning | tail -16
  keep_logs
fi
instance=$( [ -f "$OUT/model.json" ] && python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['instance'])" \
  "$OUT/model.json")
if [ "${AUTOTUNE_SECONDS:-0}" -gt 0 ]; then
  # max-autotune apart (its autotuning takes minutes a block), on the same instance where there is one
  timeout "${AUTOTUNE_SECONDS:-0}" python3 tests/bench/model_bench.py --json "$OUT/model-max-autotune.json" \
    ${instance:+--instance "$instance"} --variants inductor-max-autotune,aicg-max-autotune 2>&1 \
    | tee "$LOGS/model-autotune.log" | grep -v Warning | tail -6
  keep_logs
fi
if [ "${HOST_SECONDS:-60}" -gt 0 ] && [ -n "$instance" ]; then
  # the host's time a call of each operator of the blocks' instance: eager, through torch.ops, PyTorch's
  timeout "${HOST_SECONDS:-60}" python3 tests/bench/host_time.py "$instance" --shape 512x4096 --dtype bfloat16 \
    2>&1 | tee "$OUT/host_time.txt" | tail -12
fi
if [ "${TEST_SECONDS:-120}" -gt 0 ]; then
  FILES=tests/test_gpu_model.py FILE_SECONDS="${TEST_SECONDS:-120}" TOTAL_SECONDS="${TEST_SECONDS:-120}" \
    bash "$(dirname "$0")/device_tests.sh" > /dev/null 2>&1
  cat "$OUT/gpu-tests.txt"
fi
if [ "${BACKWARD_SECONDS:-150}" -gt 0 ]; then
  timeout "${BACKWARD_SECONDS:-150}" python3 tests/bench/backward_bench.py --json "$OUT/backward.json" ${BACKWARD_ARGS:-} 2>&1 \
    | tee "$LOGS/backward.log" | tail -12
fi
keep_logs
