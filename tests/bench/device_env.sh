# Sourced by the GPU node's scripts (device_bench.sh, device_matrix.sh): $OUT for what comes back,
# $LOGS and keep_logs (every log into $OUT/logs.tgz), the carried wheels in .whl/ installed, the
# checkout on PYTHONPATH, the GPU and versions into $LOGS/gpu.txt; hwdb_entry and record_profile below.
OUT=${OUT:-device-out}; mkdir -p "$OUT"
LOGS=$(mktemp -d)
keep_logs() { tar czf "$OUT/logs.tgz" -C "$LOGS" .; }
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$LOGS/gpu.txt"
python3 -c "import importlib.metadata as m; print({p: m.version(p) for p in ['nvidia-cuda-nvrtc','cuda-bindings','cuda-core','torch','triton','numpy']})" | tee -a "$LOGS/gpu.txt"
# The hwdb entry of the GPU present (as `doit build target=auto` resolves it).
hwdb_entry() { python3 -c "from aicg import target as t; print(t.resolve('auto', 'hwdb', t.present_device()))"; }
# record_profile PROFILE SECONDS LOG [TARGET]: doit record of PROFILE (built for TARGET, an hwdb entry,
# where given) within SECONDS; past them, what was validated so far is recorded (doit
# record_validated), so a call cut short keeps its work.
record_profile() {
  local target=${4:+target=$4}
  timeout "$2" python3 -m doit record profile="$1" $target 2>&1 | tee "$3" | tail -5 \
    || timeout 90 python3 -m doit record_validated profile="$1" $target 2>&1 | tee -a "$3" | tail -3
}
