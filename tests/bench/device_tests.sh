#!/usr/bin/env bash
# One call on a GPU node that runs the GPU tests (tests/test_gpu*.py) a file at a time, each under a
# time limit of its own, and writes what each file passed, failed and skipped, and why, to $OUT:
# a file stopped at its limit still reports the tests it finished (pytest is interrupted, not killed).
#   FILES="tests/test_gpu_model.py tests/test_gpu_jit.py"   (default: every tests/test_gpu*.py)
#   FILE_SECONDS=240                                         (each file's limit)
#   TOTAL_SECONDS=540                                        (the call's: no file starts past it, none runs beyond it)
# $OUT/gpu-tests.txt: a line a file (passed, failed, skipped, errors, seconds, "stopped" where the
# limit ended it); $OUT/gpu-tests/<file>.log: each file's pytest output with the reasons of its
# failures and skips.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
mkdir -p "$OUT/gpu-tests"
FILES=${FILES:-$(ls tests/test_gpu*.py)}
summary="$OUT/gpu-tests.txt"
: > "$summary"
deadline=$(( $(date +%s) + ${TOTAL_SECONDS:-540} ))
for file in $FILES; do
  name=$(basename "$file" .py)
  log="$OUT/gpu-tests/$name.log"
  start=$(date +%s)
  left=$(( deadline - start ))
  if [ "$left" -lt 20 ]; then
    echo "$name: not run (the call's TOTAL_SECONDS were spent)" | tee -a "$summary"
    continue
  fi
  limit=$(( left < ${FILE_SECONDS:-240} ? left : ${FILE_SECONDS:-240} ))
  timeout -s INT -k 30 "$limit" python3 -m pytest -m gpu "$file" -q -rfEs -p no:cacheprovider \
    > "$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  # pytest's last line: "3 passed, 1 skipped in 12.3s" (or "... interrupted" where the limit ended it)
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error|deselected)|no tests ran" "$log" | tail -1 | tr -d '=')
  stopped=$([ "$rc" -eq 124 ] || grep -q KeyboardInterrupt "$log" && echo " stopped at its limit" || echo "")
  echo "$name: ${counts:-no summary (rc $rc)} [${seconds} s]$stopped" | tee -a "$summary"
done
keep_logs
