"""Markdown tables of the latest recorded runs: the README's headline and the opening of
docs/performance.md. Every number comes from docs/bench/*.json (and, for a matrix case's share of
the tensor-core peak, from the hwdb entry its run names)."""
from __future__ import annotations

import math

import functools
import tomllib
from pathlib import Path

from .. import hw
from ..errors import InputError
from . import bench

SETTINGS = Path(__file__).with_name("report.toml")


@functools.cache
def settings() -> dict:
    return tomllib.loads(SETTINGS.read_text(encoding="utf-8"))


def _dims(problem: str) -> tuple[int, ...]:
    return tuple(int(d) for d in problem.split()[0].split("x"))


def case_label(problem: str) -> str:
    """"4096x4096x4096 bfloat16 kk plain" as a reader says it: sizes, the layout of B, the epilogue."""
    words = problem.split()
    label = "×".join(words[0].split("x"))
    layout = settings()["layouts"].get(words[2], words[2]) if len(words) > 2 else ""
    epilogue = words[3] if len(words) > 3 and words[3] != "plain" else ""
    parts = [label] + ([epilogue.replace("+", " + ")] if epilogue else []) + ([layout] if layout else [])
    return ", ".join(parts)


def dtype_of(problem: str) -> str:
    return problem.split()[1]


def tensor_peak(run: bench.Run, hwdb_dir: Path, dtype: str) -> tuple[float, str] | None:
    """(FLOP/s, where it comes from) of the tensor-core peak for `dtype` on the run's hwdb entry."""
    fact = settings()["peaks"].get(dtype)
    entry = run.data.get("hwdb")
    if not fact or not entry or not (Path(hwdb_dir) / f"{entry}.toml").exists():
        return None
    hardware = hw.load_target(Path(hwdb_dir), entry)
    if fact not in hardware.facts:
        return None
    return float(hardware.fact(fact)), f"`{fact}` of `hwdb/{entry}.toml` ({hardware.facts[fact].source})"


def _f(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.1f}%" if value < 0.1 else f"{value * 100:.0f}%"


def _dates(day: list[bench.Run]) -> str:
    """The runs' date, or each stage's dates where its cases come from different days."""
    dates = bench.stage_dates(day)
    if len({d for found in dates.values() for d in found}) <= 1:
        return day[-1].date
    by_dates: dict[tuple, list[str]] = {}
    for stage in ("tiny", "ragged", "square", "fused", "grid"):
        if stage in dates:
            by_dates.setdefault(tuple(dates[stage]), []).append(stage)
    return "; ".join(f"{' and '.join(stages)} {', '.join(found)}" for found, stages in sorted(by_dates.items()))


def _files(day: list[bench.Run]) -> str:
    return ", ".join(f"`docs/bench/{r.name}`" for r in day)


def _shape(row: dict) -> str:
    return "×".join(str(d) for d in row["shape"])


def _peak_share(case: dict, day: list[bench.Run], hwdb_dir: Path) -> float | None:
    peak = tensor_peak(day[-1], hwdb_dir, dtype_of(case["problem"]))
    return case["aicg_tflops"] * 1e12 / peak[0] if peak and case.get("aicg_tflops") else None


def _ratio(case: dict) -> float | None:
    return case["aicg_tflops"] / case["peer_tflops"] if case.get("aicg_tflops") and case.get("peer_tflops") else None


def _grid_line(day: list[bench.Run]) -> tuple[str, float, str] | None:
    """(what the grid covered, geometric mean of aicg over cuBLAS, the worst case) over the day's grid
    cases, each from the last run that has it (a day's runs may each time part of the grid)."""
    cases = [c for c in bench.matrix_cases(day) if c["stage"] == "grid"]
    ratios = [(r, c["problem"].split()[0]) for c in cases if (r := _ratio(c))]
    if not ratios:
        return None
    planned = {(m, n, k) for r in bench.stage_runs(day, "grid") if "grid" in r.data.get("args", {}).get("stages", [])
               for m in r.data["args"].get("grid_m", []) for n, k in r.data["args"].get("grid_nk", [])}
    ms = sorted({m for m, _, _ in planned}) or [None]
    weights = {(n, k) for _, n, k in planned}
    mean = math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios))
    worst, problem = min(ratios)
    reached = f"{len(ratios)} of {len(planned)}" if planned else f"{len(ratios)}"
    return (f"M {ms[0]}..{ms[-1]} × {len(weights)} weight shapes, {reached} cases reached", mean,
            f"{worst:.2f} at {problem.replace('x', '×')}")


def _decode_shares(day: list[bench.Run], key: str = "decode_weight_bandwidth_over_copy") -> list:
    """(m, n, k, share) per decode shape, each from the last run that has it: by default the share of
    the 1 GiB copy's bandwidth; with key="decode_over_same_bytes_copy", the speed of a copy that
    moves as many bytes as the weight has, over the kernel's."""
    shares = {}
    for run in bench.stage_runs(day, "grid"):
        for m, n, k, share in ((run.data.get("summary") or {}).get("grid") or {}).get(key, []):
            shares[(m, n, k)] = share
    return [(*key, share) for key, share in sorted(shares.items())]


def _matrix_cells(case: dict, day: list[bench.Run], hwdb_dir: Path, *digits) -> str:
    """A matrix case's aicg TFLOP/s, share of peak, peer, peer TFLOP/s and ratio, as table cells."""
    return (f"{_f(case.get('aicg_tflops'), *digits)} | {_pct(_peak_share(case, day, hwdb_dir))} | {case['peer']} | "
            f"{_f(case.get('peer_tflops'), *digits)} | {_f(_ratio(case), 2)}")


def matrix_headline(day: list[bench.Run], hwdb_dir: Path) -> list[str]:
    cases = [c for c in bench.matrix_cases(day) if c["stage"] in ("square", "fused")]
    lines = [f"**Matrix multiply** on an {day[-1].device}, {_dates(day)} ({_files(day)}): aicg's fastest "
             f"validated kernel against PyTorch's; above 1, aicg is faster.", "",
             "| case | aicg TFLOP/s | of tensor-core peak | peer | peer TFLOP/s | aicg / peer |",
             "| --- | ---: | ---: | --- | ---: | ---: |"]
    for c in cases:
        lines.append(f"| {case_label(c['problem'])} | {_matrix_cells(c, day, hwdb_dir, 0)} |")
    grid = _grid_line(day)
    if grid:
        label, mean, worst = grid
        lines.append(f"| LLM projections: {label} | | | cuBLAS | | geomean {mean:.2f}, worst {worst} |")
    return lines


def rows_headline(day: list[bench.Run]) -> list[str]:
    cases = bench.row_cases(day)
    ops = sorted({c["op"] for c in cases})
    dtypes = sorted({c["dtype"] for c in cases})
    shapes = sorted({_shape(c) for c in cases}, reverse=True)
    lines = [f"**Row operators** on an {day[-1].device}, {day[-1].date} ({_files(day)}): {len(cases)} cases, "
             f"{' and '.join(dtypes)} at {' and '.join(shapes)}; the share of a copy of the same bytes, and each "
             f"peer's time over aicg's (geometric mean over the operator's cases; above 1, aicg is faster).", "",
             "| operator | of copy bandwidth | PyTorch eager | torch.compile | Triton |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for op in ops:
        mine = [c for c in cases if c["op"] == op]
        shares = [c["of_copy"] for c in mine if c.get("of_copy")]
        share = f"{min(shares) * 100:.0f}-{max(shares) * 100:.0f}%" if shares else "-"
        means = [_f(bench.geomean(bench.peer_ratio(c, p) for c in mine), 2) for p in bench.PEERS]
        lines.append(f"| {op} | {share} | " + " | ".join(means) + " |")
    return lines


def readme_headline(runs: list[bench.Run], hwdb_dir: Path) -> str:
    parts = []
    matrix, rows = bench.latest(runs, bench.MATRIX), bench.latest(runs, bench.ROWS)
    if matrix:
        parts.append("\n".join(matrix_headline(matrix, hwdb_dir)))
    if rows:
        parts.append("\n".join(rows_headline(rows)))
    if not parts:
        raise InputError("docs/bench", "(directory)", "at least one recorded run (*.json)")
    return "\n\n".join(parts)


def _matrix_section(day: list[bench.Run], hwdb_dir: Path) -> list[str]:
    counts = bench.matrix_validations(day)
    total = sum(counts.values())
    peaks = {tensor_peak(day[-1], hwdb_dir, dtype_of(c["problem"])) for c in bench.matrix_cases(day)} - {None}
    lines = [f"### Matrix multiply: {day[-1].device}, {_dates(day)}", "",
             f"Runs: {_files(day)} (`tests/bench/matmul_bench.py`). Every kernel timed was validated against "
             f"float64 in the same run: {total} cases, " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
             + "." + "".join(f" Tensor-core peak: {v / 1e12:.1f} TFLOP/s, {where}." for v, where in sorted(peaks)), "",
             "| case | aicg TFLOP/s | of peak | peer | peer TFLOP/s | aicg / peer | aicg kernel |",
             "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for c in bench.matrix_cases(day):
        kernel = f"`{c['aicg_kernel']}`" if c.get("aicg_kernel") else "none reached within the run's budget"
        lines.append(f"| {c['stage']}: {case_label(c['problem'])} | {_matrix_cells(c, day, hwdb_dir)} | {kernel} |")
    grid = _grid_line(day)
    if grid:
        label, mean, worst = grid
        decode = ", ".join(f"{m}×{n}×{k} {share * 100:.0f}%" for m, n, k, share in _decode_shares(day))
        same = ", ".join(f"{m}×{n}×{k} {share * 100:.0f}%"
                         for m, n, k, share in _decode_shares(day, "decode_over_same_bytes_copy"))
        lines += ["", f"LLM grid, {label}: geometric mean of aicg over cuBLAS {mean:.2f}, worst {worst}."
                  + (f" Decode shapes read the weights at this share of the copy bandwidth: {decode}." if decode else "")
                  + (f" Against a copy moving the weight's bytes, timed alike (its launch and first loads "
                     f"included): {same}." if same else "")]
    return lines


def _rows_section(day: list[bench.Run]) -> list[str]:
    cases = bench.row_cases(day)
    meta = day[-1].data
    lines = [f"### Row operators: {day[-1].device}, {day[-1].date}", "",
             f"Runs: {_files(day)} (`tests/bench/test_memory_bound.py`, torch {meta.get('torch', '?')}, L2 flushed "
             f"by a {meta.get('l2_flush', 'write')} before each timed call). Each case's peers were timed in the "
             f"same run, interleaved; \"of copy\" is against a copy of the same bytes in that run.", "",
             "| case | aicg µs | TB/s | of copy | eager / aicg | compile / aicg | Triton / aicg | kernel |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in cases:
        ratios = " | ".join(_f(bench.peer_ratio(c, p), 2) for p in bench.PEERS)
        lines.append(f"| {c['op']}.{c['dtype']} {_shape(c)} | {c['seconds']['aicg'] * 1e6:.1f} | "
                     f"{_f(bench.tb_per_s(c, 'aicg'), 2)} | {_pct(c.get('of_copy'))} | {ratios} | `{c['aicg_kernel']}` |")
    at_copy = sum(1 for c in cases if (c.get("of_copy") or 0) >= 0.95)
    validated = sum(1 for c in cases if (c.get("validation") or {}).get("passed"))
    means = []
    for peer in bench.PEERS:
        values = [bench.peer_ratio(c, peer) for c in cases if bench.peer_ratio(c, peer)]
        if values:
            means.append(f"{bench.PEER_NAMES[peer]} {bench.geomean(values):.2f} ({min(values):.2f}-{max(values):.2f})")
    lines += ["", f"{len(cases)} cases, {validated} validated against float64 in the run, {at_copy} at >= 95% of the "
                  f"copy; the peers' time over aicg's, geometric mean (range): {', '.join(means)}."]
    return lines


def current_figures(runs: list[bench.Run], hwdb_dir: Path) -> str:
    lines = ["## Current figures", "",
             "The latest recorded run of each benchmark, generated from `docs/bench/` by "
             "`python -m aicg.report --docs`; the dated log below says how each came about.", ""]
    matrix, rows = bench.latest(runs, bench.MATRIX), bench.latest(runs, bench.ROWS)
    if matrix:
        lines += _matrix_section(matrix, hwdb_dir) + [""]
    if rows:
        lines += _rows_section(rows) + [""]
    return "\n".join(lines).rstrip()
