#!/usr/bin/env bash
# The headers of a kernel trial: HEAD's kernels/ with the change a commit made to kernels/ applied,
# in trials/<commit>/kernels (git-ignored), for check_candidates.py, phases.py and sass.py to take
# with --kernels. A trial whose change no longer applies to HEAD's headers fails here, on this
# machine, not on a GPU node. Prints each directory made.
#   tests/bench/trial_kernels.sh COMMIT...        (then carry `trials` to the node)
set -euo pipefail
cd "$(dirname "$0")/../.."
for rev in "$@"; do
  dir=trials/$(git rev-parse --short "$rev")
  rm -rf "$dir"
  mkdir -p "$dir"
  git archive HEAD kernels | tar -x -C "$dir"
  git diff "$rev^" "$rev" -- kernels | git apply --directory="$dir"
  echo "$dir/kernels"
done
