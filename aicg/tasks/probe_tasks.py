"""`doit probe`: measure the GPU of this node into its hwdb entry.

    doit probe             every probe, in registry order
    doit probe:<name>      one probe (doit list --all probe shows them)

Probes always run when asked (a measurement is not a function of its
inputs); what they change is decided by record.merge, which keeps a figure
that re-measured within its spread, so downstream build steps see no change
from an unchanged GPU. One ProbeGPU serves every probe of a run.
"""
from __future__ import annotations

import ast
import datetime
import importlib.util
import math
import sys
import time
import tokenize
from pathlib import Path

from doit import get_var
from doit.exceptions import TaskFailed

from .. import cli_layout, cli_vars
from ..errors import CompileError, DeviceError, InputError
from ..probe import new_entry, record, registry

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


def run_probe(name: str, hwdb_dir: Path, own_hwdb: Path | None = None) -> dict:
    """Probe `name` on this node's GPU into its entry: read among `hwdb_dir`'s, written to
    `own_hwdb` (default: hwdb_dir)."""
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
    try:
        path = record.writable_entry(hwdb_dir, own_hwdb or hwdb_dir, gpu.name, gpu.compute_capability)
        head = None if path.exists() else _new_entry_head(gpu)
        report = record.merge(path, gpu.name, gpu.compute_capability, name, result, date, gpu.driver_version, clocks,
                              head)
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


def _new_entry_head(gpu) -> str:
    """A GPU no entry knows: its entry starts with the facts its driver reports (new_entry.py)."""
    found, missing = new_entry.facts(gpu.attributes, gpu.total_memory, gpu.compute_capability)
    if missing:
        print(f"  note: {gpu.name} is new to hwdb/; its entry has the driver's facts but not {', '.join(missing)}: "
              f"add them (aicg/hw.py REQUIRED_FACTS) before building for it", file=sys.stderr, flush=True)
    return new_entry.head(gpu.name, gpu.compute_capability, found, missing)


def _first_doc_line(name: str) -> str:
    """The first line of probe `name`'s doc string, read from its source (its first token, a
    string): importing a probe loads the CUDA bindings, which `doit list` should not wait for."""
    spec = importlib.util.find_spec(f"{registry.__package__}.{name}")
    doc = None
    try:
        with open(spec.origin, encoding="utf-8") as source:
            for token in tokenize.generate_tokens(source.readline):
                if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENCODING):
                    continue
                if token.type == tokenize.STRING:
                    doc = ast.literal_eval(token.string)
                break
    except (OSError, SyntaxError, ValueError, tokenize.TokenError, AttributeError, TypeError):
        doc = None
    return (doc if isinstance(doc, str) and doc.strip() else name).strip().splitlines()[0]


def task_probe():
    """measure this node's GPU into hwdb/<gpu>.toml: doit probe (all) or doit probe:<name>"""
    layout = cli_layout.resolve(Path.cwd())   # outside a checkout: the shipped entry, written to ./hwdb
    for name in registry.ORDER:
        yield {"name": name, "doc": _first_doc_line(name),
               "actions": [(run_probe, [name, layout.hwdb, layout.own_hwdb])],
               "uptodate": [False], "verbosity": 2}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_budget(text: str | None) -> float | None:
    """`budget=` of `doit primitives`: seconds of wall clock (None: no budget, measure everything)."""
    if text is None or text == "":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError("doit primitives", "budget", "a number of seconds > 0 (budget=300)", text)
    return seconds


def run_primitives(hwdb_dir: Path, rules_dir: Path, kernels_dir: Path, budget_text: str | None = None,
                   own_hwdb: Path | None = None) -> dict:
    """The lab on this node's GPU: its entry read among `hwdb_dir`'s, the realisation profile
    written to `own_hwdb` (default: hwdb_dir), this directory's hwdb/."""
    own_hwdb = Path(own_hwdb or hwdb_dir)
    from .. import cas, config, hw, plan_inputs
    from ..primitives import lab, realisation
    from ..semantics import ruleset as ruleset_loader
    started = time.monotonic()   # a budget counts from here: the GPU's start and every compile are inside it
    try:
        seconds = parse_budget(budget_text)
        gpu = _gpu()
        entry = record.entry_for(hwdb_dir, gpu.name, gpu.compute_capability)
        limits = plan_inputs.values(plan_inputs.resolve(hw.load(entry)))
        rules = ruleset_loader.load(rules_dir)
        configs = lab.configurations(rules, limits)
        path = realisation.path_for(own_hwdb, entry.stem)
        partial = own_hwdb / f"{entry.stem}.realisation.partial.json"
        run_method = lab.method(gpu.name, gpu.driver_version)
        headers = lab.kernel_digests(rules, kernels_dir)   # what is compiled now, not after minutes of measuring
        store = cas.Store(config.load(own_hwdb.parent).local)
        # What an interrupted run (a time limit, a lost node) or the profile measured on these
        # very cubins, with this method, GPU and driver, is kept rather than measured again.
        sources = [lab.resume(partial, run_method), _profile_source(path, run_method)]
        today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
        before = gpu.clocks()
        if seconds is None:
            kept, measured = _measure_all(gpu, configs, rules, kernels_dir, limits, store, sources, partial,
                                          run_method, today)
            coverage = None
        else:
            kept, measured, coverage = _measure_within(started, seconds, gpu, configs, rules, rules_dir, hwdb_dir,
                                                       kernels_dir, limits, store, sources, partial, run_method,
                                                       today)
        after = gpu.clocks()
    except (DeviceError, CompileError, InputError) as err:
        return TaskFailed(f"primitives: {err}")
    method = (f"every runnable realisation over row lengths {list(lab.COLS)} (and "
              f"{list(lab.TINY_COLS)} where a row has one thread) at {lab.ROW_ELEMENTS} "
              f"elements per launch and at {list(lab.FEW_ROWS)} rows: events around one launch, "
              f"L2 flushed, median of "
              f"{lab.REPETITIONS}; drift on {lab.DRIFT_ROWS} rows against float64")
    if coverage is not None:
        method = (f"partial: {coverage['items_measured']} of {coverage['items']} (realisation, row length) "
                  f"items, within a budget of {coverage['budget_seconds']:g} s, most urgent first (see partial); "
                  + method.replace("every runnable realisation", "each", 1))
    provenance = {"date": today, "driver": gpu.driver_version, "clocks": f"before: {before}; after: {after}",
                  "method": method,
                  "repetitions": lab.REPETITIONS, "device": gpu.name, "arch": gpu.arch,
                  "kernels": headers, "lab": run_method,
                  "cubins": measured.cubins, "measured_on": measured.measured_on}
    if coverage is not None:
        provenance["partial"] = coverage
    if kept.cubins:
        provenance["method"] += (f"; {len(kept.cubins)} realisations kept from earlier runs of the same method "
                                 f"that measured the same cubins (measured_on gives each one's date)")
    realisation.save(path, provenance, measured.records)
    partial.unlink(missing_ok=True)
    _say(f"  wrote {len(measured.records)} measurements to {path}"
         + (f" (partial: {coverage['items_measured']} of {coverage['items']} items; `doit primitives` "
            f"again measures what is left)" if coverage else ""))
    return {"profile": str(path)}


def _measure_all(gpu, configs, rules, kernels_dir, limits, store, sources, partial, run_method, today):
    """Every realisation: all compiled first, then those no earlier run measured on the same cubin."""
    from ..primitives import lab
    _say(f"  compiling {len(configs)} realisations for {gpu.arch} (those compiled before come from the store)")
    cubins = lab.compile_all(configs, rules, kernels_dir, gpu.arch, limits["registers_per_sm"], store=store)
    digests = lab.cubin_digests(cubins)
    kept = lab.reusable(digests, sources)
    done = {(r["id"], r["cols"]) for r in kept.records}
    lengths = {c.id: tuple(n for n in lab.row_lengths(c) if (c.id, n) not in done) for c in configs}
    todo = [c for c in configs if lengths[c.id]]
    at_new_lengths = sum(c.id in kept.cubins for c in todo)
    _say(f"  {len(kept.cubins)} realisations measured before on the same cubins, {len(todo)} to measure"
         + (f" ({at_new_lengths} of them only at row lengths not measured before)" if at_new_lengths else ""))

    def so_far(new: list[dict]) -> lab.Measured:
        ids = {r["id"] for r in new}
        return lab.Measured({**kept.cubins, **{i: digests[i] for i in ids}}, kept.records + new,
                            {**kept.measured_on, **{i: today for i in ids}})
    new = lab.measure(todo, cubins, gpu.attributes["L2_CACHE_SIZE"], progress=_say,
                      keep=lambda new: lab.checkpoint(partial, run_method, so_far(new)), lengths=lengths)
    return kept, so_far(new)


def _measure_within(started, seconds, gpu, configs, rules, rules_dir, hwdb_dir, kernels_dir, limits, store,
                    sources, partial, run_method, today):
    """Within `seconds` of `started`: the most urgent items first (aicg/primitives/budget.py), each
    realisation compiled only when a round takes it. The realisations earlier runs measured are
    compiled (or taken from the store) first, to check their records are of today's cubins."""
    from .. import profile as profile_loader
    from ..primitives import budget, lab, priority
    earlier = {i for source in sources for i in source.cubins}
    cubins = lab.compile_all([c for c in configs if c.id in earlier], rules, kernels_dir, gpu.arch,
                             limits["registers_per_sm"], store=store) if earlier else {}
    kept = lab.reusable(lab.cubin_digests(cubins), sources)
    profiles = [profile_loader.load(p, rules, hwdb_dir) for p in sorted((rules_dir / "profiles").glob("*.toml"))]
    decisions = priority.profile_decisions(rules, profiles, configs, limits) + priority.grid_decisions(configs)
    items = sum(len(lab.row_lengths(c)) for c in configs)
    _say(f"  {len(kept.records)} measurements kept from earlier runs on the same cubins; {items} items "
         f"(a realisation at a row length) in all; {len(decisions)} decisions order them; "
         f"{seconds - (time.monotonic() - started):.0f} s of the budget of {seconds:g} s left")
    new: list[dict] = []

    def so_far(more: list[dict]) -> lab.Measured:
        ids = {r["id"] for r in new + more}
        digests = lab.cubin_digests({i: cubins[i] for i in ids})
        return lab.Measured({**kept.cubins, **digests}, kept.records + new + more,
                            {**kept.measured_on, **{i: today for i in ids}})

    def measure(batch: list, deadline: float) -> list[dict]:
        taken = list({item.config.id: item.config for item in batch}.values())
        cubins.update(lab.compile_all([c for c in taken if c.id not in cubins], rules, kernels_dir, gpu.arch,
                                      limits["registers_per_sm"], store=store))
        lengths: dict[str, tuple[int, ...]] = {}
        for item in batch:
            lengths[item.config.id] = lengths.get(item.config.id, ()) + (item.cols,)
        more = lab.measure(taken, cubins, gpu.attributes["L2_CACHE_SIZE"], progress=lambda line: None,
                           keep=lambda more: lab.checkpoint(partial, run_method, so_far(more)), lengths=lengths,
                           stop=lambda: time.monotonic() > deadline)
        new.extend(more)
        return more
    provenance = {"device": gpu.name, "date": today}
    spent = time.monotonic() - started
    run = budget.run(configs, decisions, rules, limits, kept.records, seconds - spent, measure, time.monotonic,
                     provenance, compiled=set(cubins), progress=_say, spent=spent)
    measured = so_far([])
    coverage = budget.partial_provenance(configs, measured.records, seconds, run.seconds)
    if coverage is not None:
        coverage["rounds"] = run.rounds
    return kept, measured, coverage


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


def run_matrix_lab(hwdb_dir: Path, kernels_dir: Path, budget_text: str | None = None,
                   own_hwdb: Path | None = None) -> dict:
    """The matrix lab on this node's GPU (aicg/matrix/lab.py): its entry read among `hwdb_dir`'s,
    the matrix profile written to `own_hwdb` (default: hwdb_dir)."""
    from ..matrix import calibration, device, worker
    from ..matrix import lab as matrix_lab
    own_hwdb = Path(own_hwdb or hwdb_dir)
    try:
        seconds = parse_budget(budget_text)
        gpu = _gpu()
        entry = record.entry_for(hwdb_dir, gpu.name, gpu.compute_capability)
        limits, _ = device.limits(hwdb_dir)
        node = matrix_lab.Node(gpu.name, tuple(gpu.compute_capability), limits, gpu.driver_version, gpu.clocks)
        if not matrix_lab.realisations(node.compute_capability, limits):
            _say(f"  matrix: no matrix template runs on {gpu.name} (compute capability "
                 f"{'.'.join(map(str, gpu.compute_capability))}): nothing to measure")
            return {"matrix_profile": None}
        result = matrix_lab.measure(node, calibration.path_for(own_hwdb, entry.stem), kernels_dir, seconds,
                                    worker.Runner(), say=_say)
    except (DeviceError, CompileError, InputError, RuntimeError) as err:
        return TaskFailed(f"primitives (matrix): {err}")
    if result["profile"] is None:
        return TaskFailed("primitives (matrix): no realisation was validated and timed: "
                          + "; ".join(f"{n}: {w}" for n, w in sorted(result["failed"].items())[:5]))
    return {"matrix_profile": result["profile"]}


FAMILIES = {"all": ("rows", "matrix"), "rows": ("rows",), "matrix": ("matrix",)}
# Of a budget both labs share, the row lab's part (it has the more realisations); the matrix lab
# has what is left when the row lab is done.
ROWS_SHARE = 0.7


def run_lab(family_text: str | None, hwdb_dir: Path, rules_dir: Path, kernels_dir: Path,
            budget_text: str | None = None, own_hwdb: Path | None = None) -> dict:
    """`doit primitives`: the row primitives' lab, then the matrix family's (family= picks one),
    within `budget` seconds in all."""
    started = time.monotonic()
    family = family_text or "all"
    if family not in FAMILIES:
        raise InputError("doit primitives", "family", "rows, matrix or all", family)
    seconds = parse_budget(budget_text)
    both = len(FAMILIES[family]) == 2
    done = {}
    if "rows" in FAMILIES[family]:
        share = None if seconds is None else seconds * (ROWS_SHARE if both else 1.0)
        done = run_primitives(hwdb_dir, rules_dir, kernels_dir, None if share is None else f"{share:g}", own_hwdb)
        if isinstance(done, TaskFailed):
            return done
    if "matrix" in FAMILIES[family]:
        left = None if seconds is None else max(1.0, seconds - (time.monotonic() - started))
        matrix = run_matrix_lab(hwdb_dir, kernels_dir, None if left is None else f"{left:g}", own_hwdb)
        if isinstance(matrix, TaskFailed):
            return matrix
        done = {**done, **matrix}
    return done


def task_primitives():
    """measure this node's GPU for the planner: hwdb/<gpu>.realisation.json (rows), .matrix.json (matrix)

    family=rows|matrix: one of them; budget=<seconds>: within that wall-clock time in all, the most
    urgent first; again: what is left."""
    layout = cli_layout.resolve(Path.cwd())   # outside a checkout: the shipped files, written to ./hwdb
    return {"actions": [(run_lab, [get_var("family"), layout.hwdb, layout.rules, layout.kernels, get_var("budget"),
                                   layout.own_hwdb])],
            "uptodate": [False], "verbosity": 2, "meta": cli_vars.meta(["family", "budget"])}
