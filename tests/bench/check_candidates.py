"""Validate and time named candidates on this node's GPU, outside any build: a quick look at a
kernel change before the lab or a build spends minutes on it.

    python tests/bench/check_candidates.py [--shapes 4096x32768,1x65536] [--kernels DIR] [--target auto] CANDIDATE_ID...

A candidate id is the planner's (family.dtype.tTHREADS.vBYTES.TOPOLOGY[.cN][.fastexp]). Each one is
compiled, checked against float64 on the awkward shapes and the given shapes (rows cut to the
longest its order keeps the bound on, as a build checks it) under a preservation preset's bounds (--preset, default tolerance; rulesets/preservation.toml), then timed at the given shapes.
--kernels takes the headers from another directory (an earlier commit's kernels/, say); given more
than once, each candidate is built with each directory's headers, every build checked, and the
builds that passed timed side by side at each shape (in order, then reversed: a median each way),
so that a change and what it replaces are timed in the same run. --same-bits also runs the builds that
passed on one fresh input a shape (the awkward shapes and the given ones, --quick or not) and fails a
candidate whose builds wrote different bytes: for a change that claims to keep the bits. --quick
checks on the awkward shapes only (no float64 reference of the large shapes on the host). Exits
non-zero if any candidate fails. --target names the hwdb entry compiled and validated for (default
auto: this machine's GPU's entry).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aicg import codegen, hw, nvrtc, occupancy, validate  # noqa: E402
from aicg import target as targets  # noqa: E402
from aicg.errors import InputError  # noqa: E402
from aicg.semantics import accuracy, ruleset  # noqa: E402

ID = re.compile(r"(?P<family>\w+)\.(?P<dtype>\w+)\.t(?P<threads>\d+)\.v(?P<vec>\d+)\.(?P<topology>\w+?)"
                r"(?:\.c(?P<cache>\d+))?(?P<fast>\.fastexp)?$")


def params_of(candidate: str) -> tuple[str, str, dict]:
    m = ID.match(candidate)
    if not m:
        raise SystemExit(f"{candidate}: not a candidate id (family.dtype.tTHREADS.vBYTES.TOPOLOGY[.cN][.fastexp])")
    return m["family"], m["dtype"], {"threads": int(m["threads"]), "vec_bytes": int(m["vec"]),
                                     "topology": m["topology"], "fast_exp": bool(m["fast"]),
                                     "cache_packs": int(m["cache"] or 0)}


def hardware_for(requested: str) -> hw.Hardware:
    """The hardware record of --target: an entry of hwdb/, or auto (this machine's GPU's entry)."""
    device = targets.present_device() if requested == targets.AUTO else None
    try:
        return hw.load_target(ROOT / "hwdb", targets.resolve(requested, ROOT / "hwdb", device))
    except InputError as err:
        raise SystemExit(f"--target: {err}") from None


def build(candidate: str, kernels: Path, rules, hardware, source: str | None = None) -> tuple[bytes, dict]:
    """The cubin and ptxas report a build makes of the candidate (aicg/occupancy.py: two blocks asked
    for where that pays) from the headers in `kernels`; `source` in place of codegen's, if given."""
    family_name, dtype, params = params_of(candidate)
    family = rules.families[family_name]
    return occupancy.compile_candidate(
        source or codegen.source(candidate, family, dtype, params), f"{candidate}.cu",
        nvrtc.include_closure(family.header, kernels), hardware.arch, params,
        hardware.fact("registers_per_sm"))[:2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--shapes", default="4096x32768,32768x4096,1x65536")
    parser.add_argument("--target", default=targets.AUTO)
    parser.add_argument("--preset", default="tolerance")
    parser.add_argument("--kernels", type=Path, action="append")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--same-bits", action="store_true")
    parser.add_argument("--repetitions", type=int, default=10)
    args = parser.parse_args()
    shapes = tuple(tuple(int(n) for n in s.split("x")) for s in args.shapes.split(","))
    kernel_dirs = args.kernels or [ROOT / "kernels"]
    rules = ruleset.load(ROOT / "rulesets")
    hardware = hardware_for(args.target)
    preset = rules.presets[args.preset]
    failed = 0
    for candidate in args.candidates:
        family_name, dtype, params = params_of(candidate)
        family = rules.families[family_name]
        # checked where a build would run it: on rows its order keeps the bound on
        longest = accuracy.longest_row(rules, family.op, dtype, params, preset.tolerance[dtype][0])
        check_shapes = accuracy.clip_shapes(validate.AWKWARD_SHAPES + (() if args.quick else shapes), longest)
        built = []
        for kernels in kernel_dirs:
            cubin, report = build(candidate, kernels, rules, hardware)
            result = validate.validate_on_device(
                cubin, hardware, family.op, dtype, params, tolerance=preset.tolerance[dtype],
                deterministic=preset.axes["deterministic"], bitwise=preset.axes["order"] == "reference",
                check_shapes=check_shapes, timed_shapes=shapes if len(kernel_dirs) == 1 else (),
                trials=2, repetitions=args.repetitions)
            failed += result["status"] != "passed"
            built.append((cubin, result))
            label = f" [{kernels}]" if len(kernel_dirs) > 1 else ""
            times = " ".join(f"{t['shape'][0]}x{t['shape'][1]} {t['median_seconds'] * 1e6:.1f} us "
                             f"({t['bytes_per_second'] / 1e12:.2f} TB/s)" for t in result.get("timings", []))
            asked = f" (asked for {report['min_blocks']} blocks)" if report["min_blocks"] else ""
            print(f"{candidate}{label}: {result['status']} regs {report['registers']}{asked} spills "
                  f"{report['spill_store_bytes']} B {validate.why_failed(result) or result.get('reason', '')} {times}",
                  flush=True)
        # a build that failed its check is not timed: its speed means nothing
        passed = [(kernels, cubin) for kernels, (cubin, result) in zip(kernel_dirs, built)
                  if result["status"] == "passed"]
        if len(kernel_dirs) > 1 and passed:
            if len(passed) < len(built):
                print(f"  timed: {', '.join(str(kernels) for kernels, _ in passed)} (the others failed)")
            cubins = [(cubin, params) for _, cubin in passed]
            if args.same_bits:
                compared = accuracy.clip_shapes(validate.AWKWARD_SHAPES + shapes, longest)   # --quick or not
                same = validate.same_bits_on_device(cubins, hardware, family.op, dtype, compared)
                differ = [s for s, equal in zip(compared, same or []) if not equal]
                failed += same is None or bool(differ)
                print("  same bits: " + ("no GPU of the target here" if same is None else
                                         f"yes, on all {len(same)} shapes" if not differ else
                                         "NO, at " + ", ".join("x".join(map(str, s)) for s in differ)), flush=True)
            for shape in shapes:   # in order, then reversed: a drift of the clock shows as a difference
                there = validate.time_on_device(cubins, hardware, family.op, dtype, shape, args.repetitions)
                back = validate.time_on_device(cubins[::-1], hardware, family.op, dtype, shape, args.repetitions)
                if there and back:
                    print(f"  {shape[0]}x{shape[1]} us: " + " | ".join(
                        f"{a * 1e6:.1f}/{b * 1e6:.1f}" for a, b in zip(there, back[::-1])), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
