"""The report's plots: the lab's bandwidth against row length per kernel, the probe curves with
their knees, and the latest benchmark against its peers."""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from .. import plan
from ..dtypes import DTYPES
from . import bench, svg, tables
from .instance import Instance
from .kernels import Ceiling, KernelFigures


@dataclass(frozen=True)
class Figure:
    svg: str
    caption: str


# ---- the lab ------------------------------------------------------------------------------------

class Lab:
    """The realisation profile's full launches, by (family, dtype): (realisation id, row length, bytes/s)."""

    def __init__(self, realisation: dict | None):
        self.provenance = (realisation or {}).get("provenance", {})
        lab = self.provenance.get("lab", {})
        elements, few = lab.get("row_elements"), set(lab.get("few_rows", []))
        self.points: dict[tuple[str, str], list[tuple[str, int, float]]] = defaultdict(list)
        for r in (realisation or {}).get("records", []):
            full = r["rows"] * r["cols"] == elements if elements else r["rows"] not in few
            if full and r.get("seconds", 0) > 0:
                self.points[(r["family"], r["dtype"])].append((r["id"], r["cols"], r["bytes"] / r["seconds"]))

    def measured_dtype(self, families: list[str], dtype: str) -> str | None:
        """The dtype whose measurements stand for `dtype`'s: its own, else one of the same element
        size (the lab times float16 as bfloat16: the same bytes moved)."""
        size = DTYPES[dtype].size
        for other in (dtype, *sorted(d for d in DTYPES if d != dtype and DTYPES[d].size == size)):
            if any((f, other) in self.points for f in families):
                return other
        return None


def lab_chart(lab: Lab, kf: KernelFigures, top: Ceiling | None) -> Figure | None:
    families = list(kf.entry.get("legal_families") or [kf.entry["family"]])
    dtype = lab.measured_dtype(families, kf.dtype)
    if dtype is None:
        return None
    points = [p for f in families for p in lab.points.get((f, dtype), [])]
    best: dict[int, float] = {}
    for _, cols, bw in points:
        best[cols] = max(best.get(cols, 0.0), bw)
    chosen_id = plan.candidate_id(kf.entry["family"], dtype, kf.entry["params"])
    chosen = [(cols, bw / 1e12) for rid, cols, bw in points if rid == chosen_id]
    series = [svg.Series(f"every realisation measured ({len(points)})",
                         tuple((c, bw / 1e12) for _, c, bw in points), svg.GREY, "dots"),
              svg.Series("best at each row length", tuple((c, bw / 1e12) for c, bw in best.items()), svg.BLUE)]
    if chosen:
        series.append(svg.Series("the chosen kernel, in the lab", tuple(chosen), svg.VERMILION))
    built = tuple((s.cols, s.bytes_per_second / 1e12) for s in kf.shapes if s.bytes_per_second)
    if built:
        series.append(svg.Series("the build's timings, at the workload's shapes", built, svg.GREEN, "markers"))
    rules = [svg.Rule(f"copy ceiling {top.bytes_per_second / 1e12:.2f} TB/s", top.bytes_per_second / 1e12, "y")] if top else []
    twin = "" if dtype == kf.dtype else f" (the lab's {dtype} twin: the same bytes moved)"
    caption = (f"{kf.name}: bandwidth of each realisation of {', '.join(families)} the lab measured at a full launch of "
               f"{lab.provenance.get('lab', {}).get('row_elements', 'many')} elements{twin}; chosen: {chosen_id}"
               + ("" if chosen else ", which the lab has not measured") + ".")
    return Figure(svg.chart(f"{kf.op} {kf.dtype}", series, rules, "row length (elements)", "TB/s", x_log=True,
                            name=f"lab:{kf.name}"), caption)


# ---- the probes ---------------------------------------------------------------------------------

_UNIT = re.compile(r"^(.*?)\s*\(([^()]*)\)\s*$")
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _split(label: str) -> tuple[str, str]:
    found = _UNIT.match(label)
    return (found.group(1), found.group(2)) if found else (label, "")


def _rate_scale(unit: str, largest: float) -> tuple[float, str]:
    """(divisor, unit shown) for a rate: byte/s in TB/s, FLOP/s in TFLOP/s, op/s in Gop/s."""
    if not unit.endswith("/s"):
        return 1.0, unit
    base = {"byte/s": "B/s"}.get(unit, unit)
    for size, prefix in _PREFIXES:
        if largest >= size:
            return size, prefix + base
    return 1.0, base


def probe_charts(curves: dict, knees: dict[str, list[str]], facts: dict[str, dict]) -> list[tuple[str, list[str], list[Figure]]]:
    """(probe, its notes, its charts) for every probe that recorded curves."""
    out = []
    for probe in sorted(curves):
        group = curves[probe]
        figures = []
        for name in sorted(group.get("curves", {})):
            curve = group["curves"][name]
            points = [(float(x), float(y)) for x, y in curve["points"] if x > 0 and y > 0]
            if len(points) < 2:
                continue
            x_name, x_unit = _split(curve["x"])
            y_name, y_unit = _split(curve["y"])
            divisor, shown = _rate_scale(y_unit, max(y for _, y in points))
            xs, ys = [x for x, _ in points], [y for _, y in points]
            rules = []
            for fact in knees.get(f"{probe}.{name}", []):
                if fact in facts:
                    value = float(facts[fact]["value"])
                    label = svg.binary_size(value) if x_unit == "byte" else svg.number(round(value, 3))
                    rules.append(svg.Rule(f"{fact} = {label}", value, "x", svg.VERMILION))
            x_format = svg.binary_size if x_unit == "byte" else svg.number
            chart = svg.chart(f"{probe}: {name}", [svg.Series(y_name, tuple((x, y / divisor) for x, y in points),
                                                              svg.BLUE)],
                              rules, f"{x_name}" + (f" ({x_unit})" if x_unit and x_unit != "byte" else ""),
                              f"{y_name} ({shown})" if shown else y_name,
                              x_log=max(xs) / min(xs) >= 4, y_log=max(ys) / min(ys) > 200, y_from_zero=True,
                              x_format=x_format, name=f"probe:{probe}.{name}")
            figures.append(Figure(chart, f"{probe}.{name}, measured {group.get('date', '?')}"))
        if figures:
            out.append((probe, list(group.get("notes", [])), figures))
    return out


# ---- the benchmark ------------------------------------------------------------------------------

ROW_CONTENDERS = [svg.Contender("aicg", svg.VERMILION, "circle"), svg.Contender("torch.compile", svg.BLUE, "triangle"),
                  svg.Contender("Triton", svg.GREEN, "diamond"), svg.Contender("PyTorch eager", svg.SKY, "square"),
                  svg.Contender("copy of the same bytes", svg.GREY, "bar")]
_ROW_KEYS = {"aicg": "aicg", "torch.compile": "compile", "Triton": "triton", "PyTorch eager": "eager",
             "copy of the same bytes": "copy"}
_PEER_COLOURS = [(svg.BLUE, "triangle"), (svg.SKY, "square"), (svg.GREEN, "diamond"), (svg.PURPLE, "bar")]


def rows_bench_chart(day: list[bench.Run]) -> Figure | None:
    cases = bench.row_cases(day)
    if not cases:
        return None
    rows = []
    for c in cases:
        values = {name: bench.tb_per_s(c, key) for name, key in _ROW_KEYS.items()}
        rows.append((f"{c['op']} {c['dtype']} {'×'.join(map(str, c['shape']))}",
                     {k: v for k, v in values.items() if v}))
    chart = svg.dot_plot(f"Row operators against their peers: {day[-1].device}, {day[-1].date}", rows,
                         ROW_CONTENDERS, "TB/s moved (more is faster)", name="bench:rows")
    return Figure(chart, "From " + ", ".join(f"docs/bench/{r.name}" for r in day) + ": each case's contenders timed "
                  "in the same run, interleaved, the L2 flushed before each call.")


def matrix_bench_chart(day: list[bench.Run], hwdb_dir) -> Figure | None:
    cases = bench.matrix_cases(day)
    if not cases:
        return None
    peers = sorted({c["peer"] for c in cases})
    contenders = [svg.Contender("aicg", svg.VERMILION, "circle")]
    contenders += [svg.Contender(p, *_PEER_COLOURS[i % len(_PEER_COLOURS)]) for i, p in enumerate(peers)]
    by_problem: dict[tuple, dict] = {}
    for c in cases:
        row = by_problem.setdefault((c["stage"], c["problem"]), {})
        if c.get("aicg_tflops"):
            row["aicg"] = c["aicg_tflops"]
        if c.get("peer_tflops"):
            row[c["peer"]] = c["peer_tflops"]
    rows = [(f"{stage}: {tables.case_label(problem)}", values) for (stage, problem), values in by_problem.items()]
    peak = tables.tensor_peak(day[-1], hwdb_dir, tables.dtype_of(cases[0]["problem"]))
    rules = [svg.Rule(f"tensor-core peak {peak[0] / 1e12:.0f} TFLOP/s", peak[0] / 1e12, "x", svg.TEXT)] if peak else []
    chart = svg.dot_plot(f"Matrix multiply against its peers: {day[-1].device}, {day[-1].date}", rows, contenders,
                         "TFLOP/s (more is faster)", rules=rules, name="bench:matrix")
    return Figure(chart, "From " + ", ".join(f"docs/bench/{r.name}" for r in day) + ": every aicg kernel validated "
                  "against float64 in the same run.")


def bench_figures(instance: Instance, runs: list[bench.Run], hwdb_dir) -> tuple[list[Figure], list[str]]:
    """The latest runs on the instance's GPU (or, where none ran there, the latest on any), with notes."""
    device = instance.target["name"]
    figures, notes = [], []
    for kind, make in ((bench.ROWS, rows_bench_chart), (bench.MATRIX, lambda d: matrix_bench_chart(d, hwdb_dir))):
        day = bench.latest(runs, kind, device)
        if not day:
            day = bench.latest(runs, kind)
            if day:
                notes.append(f"No {'row-operator' if kind == bench.ROWS else 'matrix-multiply'} benchmark has been "
                             f"recorded on an {device}; the latest, on an {day[-1].device}, is shown.")
        figure = make(day) if day else None
        if figure:
            figures.append(figure)
    return figures, notes
