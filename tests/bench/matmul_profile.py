"""Write a GPU's matrix profile (hwdb/<gpu>.matrix.json) from runs of tests/bench/matmul_bench.py.

    python tests/bench/matmul_profile.py RUN.json [RUN.json ...] --out hwdb/<gpu>.matrix.json
        [--driver VERSION] [--clocks TEXT]

Runs that are not matmul_bench runs, or that evicted the L2 by a write (--flush write), are left out
and named: a glob of docs/bench/ serves. tests/bench/decode_inflight.py writes its realisation runs
in the same form (their cases, device and arch), so its runs count as bench runs.

Each case a run timed (the square, fused and grid stages) and validated against float64 in the
same run becomes a record: the realisation, M, N, K and the median seconds; the fastest median
where several runs timed one realisation at one shape. Cases of realisations that the space
(aicg/matrix/space.toml) no longer names, and those that failed validation, are left out and
counted. The runs must come from one GPU; the driver and clocks are read from the runs where they
recorded them, else taken from the options.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicg.matrix import calibration, space  # noqa: E402

TIMED_STAGES = ("square", "fused", "grid")
DTYPE_NAMES = {"bf16": "bfloat16", "f16": "float16"}


def _epilogue(name: str) -> space.Epilogue:
    parts = set() if name == "plain" else set(name.split("+"))
    activation = next((p for p in parts if p in space.ACTIVATIONS), "none")
    return space.Epilogue(activation, bias="bias" in parts, residual="residual" in parts)


@functools.cache
def _named(template: str, dtype: str, a: str, b: str, epilogue: space.Epilogue) -> dict[str, space.Realisation]:
    found = {}
    for knobs in space.knob_settings(template):
        real = space.realisation(template, dtype, a, b, epilogue, **knobs)
        found[real.name] = real
    return found


def realisation_of(name: str) -> space.Realisation | None:
    """The realisation the space names `name` (None: it names none now)."""
    try:
        template, dtype, layouts, _, epilogue = name.split(".")
        a, b = ("k", layouts[1:]) if layouts.startswith("k") else ("mn", layouts[2:])
        return _named(template, DTYPE_NAMES[dtype], a, b, _epilogue(epilogue)).get(name)
    except (KeyError, ValueError):
        return None


def _shape(problem: str) -> tuple[int, int, int]:
    m, n, k = problem.split()[0].split("x")
    return int(m), int(n), int(k)


def usable(runs: list[tuple[str, dict]]) -> tuple[list[tuple[str, dict]], list[str]]:
    """(the runs a profile takes, why each other was left out): runs in matmul_bench's form only (a
    diagnostic file records no arch), and only those that evicted the L2 by a read, the method every other run
    and the build's own timings use (a write flush leaves dirty lines for the kernel to write back)."""
    taken, left = [], []
    for name, data in runs:
        if "arch" not in data or "cases" not in data:
            left.append(f"{name}: not a matmul_bench run")
        elif data.get("args", {}).get("flush", "read") != "read":
            left.append(f"{name}: the L2 evicted by a {data['args']['flush']}, not a read")
        else:
            taken.append((name, data))
    return taken, left


def collect(runs: list[tuple[str, dict]]) -> tuple[dict, list[dict], dict[str, int]]:
    """(provenance without driver and clocks, records, counts of the cases left out by reason)."""
    devices = {(d["device"]["name"], d["arch"]) for _, d in runs}
    if len(devices) != 1:
        raise SystemExit(f"the runs come from more than one GPU: {sorted(devices)}")
    (device, arch), = devices
    best: dict[tuple, dict] = {}
    left_out = {"not validated": 0, "not in the space": 0}
    repetitions, methods = set(), set()
    for _, data in runs:
        for case in data["cases"]:
            if case.get("stage") not in TIMED_STAGES or "timing" not in case:
                continue
            if case.get("validation", {}).get("status") != "passed":
                left_out["not validated"] += 1
                continue
            real = realisation_of(case["realisation"])
            if real is None:
                left_out["not in the space"] += 1
                continue
            timing = case["timing"]
            repetitions.add(timing["repetitions"])
            methods.add(timing["method"])
            key = (real.name, _shape(case["problem"]))
            if key not in best or timing["median_seconds"] < best[key]["seconds"]:
                m, n, k = key[1]
                best[key] = {"realisation": real.as_dict(), "m": m, "n": n, "k": k,
                             "seconds": timing["median_seconds"]}
    # a run's date is its file name's prefix; one named without a date (a device call's own run) is today's
    dates = sorted({m[0] if (m := re.match(r"\d{4}-\d\d-\d\d", Path(name).name))
                    else datetime.date.today().isoformat() for name, _ in runs})
    provenance = {"date": dates[-1], "device": device, "arch": arch,
                  "repetitions": min(repetitions) if repetitions else 0,
                  "method": "tests/bench/matmul_bench.py: " + "; ".join(sorted(methods)) +
                            "; each validated against float64 in the same run; the fastest median of the runs",
                  "runs": [Path(name).name for name, _ in runs]}
    return provenance, sorted(best.values(), key=lambda r: (r["realisation"]["template"], r["m"], r["n"], r["k"],
                                                              str(r["realisation"]))), left_out


def main(argv=None) -> int:
    import json
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--driver", help="the driver version, where the runs did not record it")
    parser.add_argument("--clocks", default="not recorded by the runs")
    args = parser.parse_args(argv)
    runs, left = usable([(str(p), json.loads(p.read_text())) for p in args.runs])
    for why in left:
        print(f"left out {why}")
    if not runs:
        raise SystemExit("no matmul_bench run with the L2 evicted by a read among the runs")
    provenance, records, left_out = collect(runs)
    drivers = {d.get("driver") for _, d in runs} - {None}
    driver = drivers.pop() if len(drivers) == 1 else args.driver
    if not driver:
        raise SystemExit("the runs do not record one driver: give --driver")
    clocks = sorted({d["clocks"] for _, d in runs if d.get("clocks")})
    provenance.update(driver=driver, clocks="; ".join(clocks) or args.clocks)
    kernels = [d.get("kernels") for _, d in runs]
    if kernels and all(kernels) and all(k == kernels[0] for k in kernels):
        provenance["kernels"] = kernels[0]    # the headers measured (digests), where every run recorded the same
    if not records:
        raise SystemExit("no validated timed case in the runs")
    calibration.save(args.out, provenance, records)
    calibration.load(args.out)   # what the planner will read, checked
    print(f"{args.out}: {len(records)} records; left out: "
          + ", ".join(f"{n} {why}" for why, n in left_out.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
