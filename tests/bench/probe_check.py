"""On a GPU node, beside `doit probe`: the peers and checks the probe figures are judged by.

    python3 tests/bench/probe_check.py hwdb/<this GPU's entry>.toml OUT_DIR

Measures a PyTorch device-to-device copy of the same size as the dram probe's
(bytes read + written over event time, median of 7 x 5) against the entry's
measured copy bandwidth, and disassembles every probe cubin for the entry's
arch with cuobjdump (where the node has it), counting the SASS instructions
each probe means to measure. Writes OUT_DIR/probe_check.json and prints a
table. The entry is read as `doit probe` leaves it: one it has just created,
with the driver's facts in place of a datasheet's, will do.
"""
from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aicg.probe import registry  # noqa: E402
from aicg.probe.gpu import compile_probe  # noqa: E402

# SASS the probes are about: what each kernel file must contain.
EXPECTED_SASS = {
    "dram.cu": ["LDG.E.128", "STG.E.128", "LDG.E.64", "LDG.E"],
    "working_set.cu": ["LDG"],
    "latency.cu": ["CS2R", "LDG", "LDS"],
    "stride.cu": ["LDG"],
    "banks.cu": ["LDS", "LDS.64", "LDS.128"],
    "mma.cu": ["HMMA", "QMMA", "IMMA"],
    "wgmma.cu": ["HGMMA", "WARPGROUP"],
    "async_copy.cu": ["LDGSTS", "UBLKCP", "SYNCS"],
    "atomics.cu": ["ATOMG", "RED", "ATOM"],
    "clock.cu": ["CS2R"],
    "launch.cu": ["EXIT"],
}


def torch_copy(nbytes: int) -> dict:
    import torch
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        b.copy_(a)
    reps = []
    for _ in range(7):
        times = []
        for _ in range(5):
            start.record()
            b.copy_(a)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        reps.append(statistics.median(times))
    rates = [2 * nbytes / (ms * 1e-3) for ms in reps]
    return {"bytes": nbytes, "median": statistics.median(rates), "spread": (max(rates) - min(rates)) / statistics.median(rates),
            "torch": torch.__version__}


def sass_counts(arch: str) -> dict:
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {"error": "no cuobjdump on this node"}
    found = {}
    for module in registry.all_probes():
        for file, archs in module.SOURCES:
            target = arch if arch in archs else next((a for a in archs if a.startswith(arch)), None)
            if target is None:
                continue
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compile_probe(file, target))
                f.flush()
                sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True).stdout
            opcodes = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)
            counts = {}
            for op in opcodes:
                counts[op] = counts.get(op, 0) + 1
            expected = {e: sum(n for op, n in counts.items() if op.startswith(e)) for e in EXPECTED_SASS.get(file, [])}
            found[f"{file}@{target}"] = {"expected": expected, "opcodes": dict(sorted(counts.items()))}
    return found


def main(entry: str, out_dir: str) -> None:
    out = Path(out_dir)
    doc = tomllib.loads(Path(entry).read_text(encoding="utf-8"))
    result = {"torch_copy": torch_copy(1 << 31), "sass": sass_counts(doc["identity"]["arch"])}
    probe_copy = doc.get("measured", {}).get("dram_copy_bandwidth")
    if probe_copy:
        result["dram_copy_over_torch"] = probe_copy["value"] / result["torch_copy"]["median"]
    (out / "probe_check.json").write_text(json.dumps(result, indent=1))
    print(f"torch copy {result['torch_copy']['median'] / 1e12:.3f} TB/s; probe copy / torch copy = "
          f"{result.get('dram_copy_over_torch', float('nan')):.3f}")
    for name, found in result["sass"].items():
        if isinstance(found, dict) and "expected" in found:
            print(f"{name:28s} " + ", ".join(f"{k}: {v}" for k, v in found["expected"].items()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
