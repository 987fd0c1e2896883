"""How well the planner's priors pick kernels: exhaustive timing against planned picks.

    python3 tests/bench/plan_accuracy.py measure OUT.json [ROWSxCOLS,...]  # on the GPU node
    python3 tests/bench/plan_accuracy.py report OUT.json      # anywhere: needs the realisation profile

`measure` compiles every legal candidate of the default profile's workload
(with ACCURACY_SHAPES, awkward ones included) for this machine's GPU (its hwdb
entry, as `doit build target=auto` finds it), checks each against float64 on
a small awkward shape, and times it on every shape (events, L2 flushed,
median). `report` ranks the same candidates with the measured prior
(realisation profile + probed hwdb) and with the datasheet-only model, takes
what the planner would benchmark (candidates_per_family per family and
dtype), and compares the pick (fastest measured geometric mean among those)
with the exhaustive best: the share benchmarked, the slowdown of each pick,
and Spearman's rank correlation between predicted and measured times, planned
for the entry the measurement was made on.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from aicg import hw, plan, plan_inputs, profile  # noqa: E402
from aicg import target as targets  # noqa: E402
from aicg.primitives import realisation  # noqa: E402
from aicg.semantics import ruleset as ruleset_loader  # noqa: E402

ACCURACY_SHAPES = ((32768, 4096), (4096, 32768), (8192, 1000), (65536, 128), (3001, 333), (256, 8192))
CHECK_SHAPE = (64, 333)


def _setup(target: str, shapes=ACCURACY_SHAPES):
    """The default profile's rules, profile (for `target`, with `shapes`) and hardware record."""
    rules = ruleset_loader.load(REPO / "rulesets")
    prof = targets.retarget(profile.load(REPO / "rulesets/profiles/default.toml", rules, REPO / "hwdb"), target)
    work = {op: dataclasses.replace(w, shapes=shapes) for op, w in prof.workload.items()}
    prof = dataclasses.replace(prof, workload=work)
    return rules, prof, hw.load_target(REPO / "hwdb", prof.target)


def _all_candidates(rules, prof, inputs, measured=None):
    return plan.plan_workload(rules, prof, inputs, per_family=10**6, measured=measured)


def measure(out: str, shapes: str | None = None) -> None:
    """Time every candidate on ACCURACY_SHAPES, or on `shapes` ("32768x4096,4096x32768")."""
    from aicg.primitives import lab
    from aicg.runtime import driver
    from aicg.validate import check
    shapes = (tuple(tuple(int(n) for n in s.split("x")) for s in shapes.split(","))
              if shapes else ACCURACY_SHAPES)
    hardware, reason = targets.gpu_target(REPO / "hwdb", targets.present_device())
    if hardware is None:
        raise SystemExit(reason)
    rules, prof, target = _setup(hardware.target, shapes)
    inputs = plan_inputs.values(plan_inputs.resolve(target, measured=False))
    candidates = [c for _, cands in _all_candidates(rules, prof, inputs).values() for c in cands]
    configs = [lab.Config(c.op, c.family, c.dtype, c.params) for c in candidates]
    cubins = lab.compile_all(configs, rules, REPO / "kernels", target.arch, target.fact("registers_per_sm"))
    device = driver.probe_device()
    results = {}
    for i, c in enumerate(candidates):
        tol = prof.preservation.tolerance[c.dtype]
        r = check.run(cubins[c.id], c.op, c.dtype, c.params, tolerance=tol, deterministic=False, bitwise=False,
                      check_shapes=[CHECK_SHAPE], timed_shapes=list(shapes), trials=1, repetitions=7,
                      device=device, peak_bytes_per_second=target.fact("dram_bandwidth"))
        results[c.id] = {"op": c.op, "dtype": c.dtype, "status": r["status"],
                         "seconds": [t["median_seconds"] for t in r["timings"]]}
        if i % 50 == 0:
            print(f"  {i}/{len(candidates)} {c.id}: {r['status']}", flush=True)
    Path(out).write_text(json.dumps({"shapes": shapes, "device": device.name, "target": target.target,
                                     "results": results}))
    print(f"timed {len(results)} candidates, {sum(r['status'] == 'passed' for r in results.values())} passed")


def _target_of(data: dict) -> str:
    """The entry a recorded measurement was made on: its target, or (before runs recorded one) the
    entry whose identity names its device."""
    if "target" in data:
        return data["target"]
    for entry in targets.known(REPO / "hwdb"):
        if hw.load_target(REPO / "hwdb", entry).name == data["device"]:
            return entry
    raise SystemExit(f"no entry of hwdb/ names {data['device']}, the device the measurement was made on")


def _geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def _spearman(a, b) -> float:
    def ranks(xs):
        order = sorted(range(len(xs)), key=xs.__getitem__)
        r = [0.0] * len(xs)
        for rank, i in enumerate(order):
            r[i] = rank
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


def report(measured_path: str, realisation_path: str | None = None) -> dict:
    """How well each prior ranks the candidates timed in `measured_path`; the measured prior
    reads `realisation_path` (default: the hwdb's profile; it should be the profile of the
    kernels that were timed)."""
    data = json.loads(Path(measured_path).read_text())
    timed = {cid: r for cid, r in data["results"].items() if r["status"] == "passed"}
    rules, prof, target = _setup(_target_of(data))
    real = realisation.load(Path(realisation_path) if realisation_path else realisation.path_for(REPO / "hwdb", target.target))
    models = {"datasheet": (plan_inputs.values(plan_inputs.resolve(target, measured=False)), None)}
    if real is not None:
        probed = plan_inputs.values(plan_inputs.resolve(target))
        models["measured"] = (probed, realisation.MeasuredPrior(real, probed))
    out = {}
    for name, (inputs, prior) in models.items():
        planned = _all_candidates(rules, prof, inputs, prior)
        cases, rhos, benchmarked, total = [], [], 0, 0
        for op, (decided, pool) in planned.items():
            for dtype in prof.workload[op].dtypes:
                mine = [c for c in pool if c.dtype == dtype and c.id in timed]
                if not mine:   # a dtype the recorded run did not time (it predates float16 in the profile)
                    continue
                total += len(mine)
                picked = []
                longest = max(cols for _, cols in prof.workload[op].shapes)
                for family in {c.family for c in mine}:
                    picked += plan._best_spread([c for c in mine if c.family == family], prof.candidates_per_family,
                                                lambda c: plan.structure(c, longest, inputs))
                benchmarked += len(picked)
                measured_of = {c.id: _geomean(timed[c.id]["seconds"]) for c in mine}
                best = min(measured_of.values())
                pick = min(measured_of[c.id] for c in picked)
                cases.append({"op": op, "dtype": dtype, "slowdown": pick / best, "benchmarked": len(picked),
                              "legal": len(mine)})
                rhos.append(_spearman([c.score for c in mine], [measured_of[c.id] for c in mine]))
        slow = [c["slowdown"] for c in cases]
        out[name] = {"benchmarked_share": benchmarked / total, "within_5pct": sum(s <= 1.05 for s in slow) / len(slow),
                     "worst_slowdown": max(slow), "median_rank_correlation": sorted(rhos)[len(rhos) // 2],
                     "rank_correlations": rhos, "cases": cases}
        print(f"{name:9s}: benchmarked {benchmarked}/{total} ({benchmarked / total:.0%}); picks within 5% of the "
              f"exhaustive best: {out[name]['within_5pct']:.0%}; worst {max(slow):.3f}x; "
              f"median Spearman {out[name]['median_rank_correlation']:.2f}")
        for c, rho in zip(cases, rhos):
            print(f"    {c['op']:9s} {c['dtype']:8s} legal {c['legal']:3d} benchmarked {c['benchmarked']:2d} "
                  f"pick/best {c['slowdown']:.3f}  rho {rho:.2f}")
    return out


if __name__ == "__main__":
    {"measure": measure, "report": report}[sys.argv[1]](*sys.argv[2:])
