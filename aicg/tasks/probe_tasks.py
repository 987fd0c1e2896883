"""`doit probe`: measure the GPU of this node into its hwdb entry.

    doit probe             every probe, in registry order
    doit probe:<name>      one probe (doit list --all probe shows them)

Probes always run when asked (a measurement is not a function of its
inputs); what they change is decided by record.merge, which keeps a figure
that re-measured within its spread, so downstream build steps see no change
from an unchanged GPU. One ProbeGPU serves every probe of a run.
"""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

from doit.exceptions import TaskFailed

from ..errors import CompileError, DeviceError, InputError
from ..probe import record, registry

_session: dict = {}


def _gpu():
    if "gpu" not in _session:
        from ..probe.gpu import ProbeGPU
        _session["gpu"] = ProbeGPU()
    return _session["gpu"]


def _format(value: float, unit: str) -> str:
    scaled = {"byte/s": (1e12, "TB/s"), "byte": (2**20, "MiB"), "FLOP/s": (1e12, "TFLOP/s"), "op/s": (1e9, "Gop/s"),
              "s": (1e-6, "us")}.get(unit)
    if scaled and abs(value) >= scaled[0] * 1e-3:
        return f"{value / scaled[0]:.4g} {scaled[1]}"
    return f"{value:.4g} {unit}"


def run_probe(name: str, hwdb_dir: Path) -> dict:
    try:
        gpu = _gpu()
        module = registry.probe(name)
        before = gpu.clocks()
        result = module.run(gpu)
        gpu.synchronize()
        after = gpu.clocks()
    except (DeviceError, CompileError) as err:
        return TaskFailed(f"probe {name}: {err}")
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    clocks = f"before: {before}; after: {after}"
    path = record.entry_for(hwdb_dir, gpu.name, gpu.compute_capability)
    try:
        report = record.merge(path, gpu.name, gpu.compute_capability, name, result, date, gpu.driver_version, clocks)
    except InputError as err:
        return TaskFailed(str(err))
    record.write_curves(path, name, result, date, clocks)
    for fig in result.figures:
        status = "new" if fig.name in report.added else "changed" if fig.name in report.replaced else "within spread"
        print(f"  {fig.name:34s} {_format(fig.value, fig.unit):>14s}  ±{fig.spread:.1%}  ({status})",
              file=sys.stderr, flush=True)
    for note in result.notes:
        print(f"  note: {note}", file=sys.stderr, flush=True)
    return {"hwdb": str(path), "changed": report.added + report.replaced}


def task_probe():
    """measure this node's GPU into hwdb/<gpu>.toml: doit probe (all) or doit probe:<name>"""
    hwdb_dir = Path.cwd() / "hwdb"
    for name in registry.ORDER:
        doc = (registry.probe(name).__doc__ or name).strip().splitlines()[0]
        yield {"name": name, "doc": doc, "actions": [(run_probe, [name, hwdb_dir])],
               "uptodate": [False], "verbosity": 2}


def run_primitives(hwdb_dir: Path, rules_dir: Path, kernels_dir: Path) -> dict:
    from .. import cas, config, hw, plan_inputs
    from ..primitives import lab, realisation
    from ..semantics import ruleset as ruleset_loader
    try:
        gpu = _gpu()
        entry = record.entry_for(hwdb_dir, gpu.name, gpu.compute_capability)
        limits = plan_inputs.values(plan_inputs.resolve(hw.load(entry)))
        rules = ruleset_loader.load(rules_dir)
        configs = lab.configurations(rules, limits)
        path = realisation.path_for(hwdb_dir, entry.stem)
        partial = hwdb_dir / f"{entry.stem}.realisation.partial.json"
        run_method = lab.method(gpu.name, gpu.driver_version)
        headers = lab.kernel_digests(rules, kernels_dir)   # what is compiled now, not after minutes of measuring
        print(f"  compiling {len(configs)} realisations for {gpu.arch} (those compiled before come from the store)",
              file=sys.stderr, flush=True)
        cubins = lab.compile_all(configs, rules, kernels_dir, gpu.arch, limits["registers_per_sm"],
                                  store=cas.Store(config.load(hwdb_dir.parent).local))
        digests = lab.cubin_digests(cubins)
        # What an interrupted run (a time limit, a lost node) or the profile measured on these
        # very cubins, with this method, GPU and driver, is kept rather than measured again.
        kept = lab.reusable(digests, [lab.resume(partial, run_method), _profile_source(path, run_method)])
        done = {(r["id"], r["cols"]) for r in kept.records}
        lengths = {c.id: tuple(n for n in lab.row_lengths(c) if (c.id, n) not in done) for c in configs}
        todo = [c for c in configs if lengths[c.id]]
        at_new_lengths = sum(c.id in kept.cubins for c in todo)
        print(f"  {len(kept.cubins)} realisations measured before on the same cubins, {len(todo)} to measure"
              + (f" ({at_new_lengths} of them only at row lengths not measured before)" if at_new_lengths else ""),
              file=sys.stderr, flush=True)
        today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()

        def so_far(new: list[dict]) -> lab.Measured:
            ids = {r["id"] for r in new}
            return lab.Measured({**kept.cubins, **{i: digests[i] for i in ids}}, kept.records + new,
                                {**kept.measured_on, **{i: today for i in ids}})
        before = gpu.clocks()
        new = lab.measure(todo, cubins, gpu.attributes["L2_CACHE_SIZE"],
                          progress=lambda line: print(line, file=sys.stderr, flush=True),
                          keep=lambda new: lab.checkpoint(partial, run_method, so_far(new)), lengths=lengths)
        after = gpu.clocks()
        measured = so_far(new)
    except (DeviceError, CompileError, InputError) as err:
        return TaskFailed(f"primitives: {err}")
    provenance = {"date": today, "driver": gpu.driver_version, "clocks": f"before: {before}; after: {after}",
                  "method": f"every runnable realisation over row lengths {list(lab.COLS)} (and "
                            f"{list(lab.TINY_COLS)} where a row has one thread) at {lab.ROW_ELEMENTS} "
                            f"elements per launch and at {list(lab.FEW_ROWS)} rows: events around one launch, "
                            f"L2 flushed, median of "
                            f"{lab.REPETITIONS}; drift on {lab.DRIFT_ROWS} rows against float64",
                  "repetitions": lab.REPETITIONS, "device": gpu.name, "arch": gpu.arch,
                  "kernels": headers, "lab": run_method,
                  "cubins": measured.cubins, "measured_on": measured.measured_on}
    if kept.cubins:
        provenance["method"] += (f"; {len(kept.cubins)} realisations kept from earlier runs of the same method "
                                 f"that measured the same cubins (measured_on gives each one's date)")
    realisation.save(path, provenance, measured.records)
    partial.unlink(missing_ok=True)
    print(f"  wrote {len(measured.records)} measurements to {path}", file=sys.stderr, flush=True)
    return {"profile": str(path)}


def _profile_source(path: Path, run_method: dict):
    """What the profile at `path` measured, where the same method measured it (older profiles
    record no method or cubins: nothing is kept from them)."""
    from ..primitives import lab, realisation
    profile = realisation.load(path)
    if profile is None or not lab.same_method(profile.provenance.get("lab"), run_method):
        return lab.NOTHING
    cubins = profile.provenance.get("cubins", {})
    dates = profile.provenance.get("measured_on", {})
    return lab.Measured(cubins, list(profile.records), {i: dates.get(i, profile.provenance["date"]) for i in cubins})


def task_primitives():
    """measure every realisation of the row primitives on this node's GPU into hwdb/<gpu>.realisation.json"""
    root = Path.cwd()
    return {"actions": [(run_primitives, [root / "hwdb", root / "rulesets", root / "kernels"])],
            "uptodate": [False], "verbosity": 2}
