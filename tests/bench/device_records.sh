#!/usr/bin/env bash
# One call on a GPU node that records what this GPU validates (doit record) for every shipped
# profile whose target is this GPU's hwdb entry, so that CPU-only builds of them come out validated
# (docs/trust.md). Each profile's record has a time limit; past it, what was validated so far is
# recorded (doit record_validated) and the next call's record validates only the rest.
#   PROFILES="rulesets/profiles/h200.toml rulesets/profiles/fused.toml"   (default: every profile of this GPU's entry;
#                            one whose target is another GPU is skipped, named, unless EVERY_PROFILE=1)
#   EVERY_PROFILE=1          (every shipped profile instead, each built for this GPU: target=<its entry>)
#   RECORD_SECONDS=300       (each profile's limit)
# The record, hwdb/<entry>.validations.jsonl, lands in $OUT after each profile, with logs.tgz.
set -uo pipefail
. "$(dirname "$0")/device_env.sh"
entry=$(hwdb_entry) || exit 1
echo "hwdb entry: $entry" | tee -a "$LOGS/gpu.txt"
if [ -z "${PROFILES:-}" ]; then
  PROFILES=$(python3 - "$entry" "${EVERY_PROFILE:-0}" <<'PY'
import sys, tomllib
from pathlib import Path
print(" ".join(str(p) for p in sorted(Path("rulesets/profiles").glob("*.toml"))
               if sys.argv[2] == "1" or tomllib.loads(p.read_text()).get("instance", {}).get("target") == sys.argv[1]))
PY
)
fi
echo "profiles: ${PROFILES:-none}"
for profile in $PROFILES; do
  # a profile for another GPU is recorded here only when asked (EVERY_PROFILE=1): a GPU that came
  # in place of the one asked for would otherwise record validations nobody builds from
  target=$(python3 -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb')).get('instance', {}).get('target', ''))" "$profile")
  if [ "${EVERY_PROFILE:-0}" != 1 ] && [ "$target" != "$entry" ]; then
    echo "skipped $profile: its target is $target, this GPU's entry $entry (EVERY_PROFILE=1 records it built for this GPU)"
    continue
  fi
  record_profile "$profile" "${RECORD_SECONDS:-300}" "$LOGS/record-$(basename "$profile" .toml).log" "$entry"
  cp "hwdb/$entry.validations.jsonl" "$OUT/" 2>/dev/null
  keep_logs
done
