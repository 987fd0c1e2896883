"""The instance report: built by `doit report` on a real instance (two operators on the H100,
validated by its shipped record, so a machine without a GPU times them as the H100 did), its
numbers traced to the build's files, nothing fetched, and a screenshot from headless Chromium
whose plots have ink (saved as artefacts/report.png)."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from aicg import cas
from aicg import report
from aicg.errors import InputError
from aicg.report import bench, svg, tables
from doit_project import REPO, make_project

PROFILE = """[instance]
name = "report"
target = "h100-sxm"
preservation = "tolerance"

[plan]
candidates_per_family = 4

[[workload]]
ops = ["softmax", "row_sum"]
dtypes = ["float32"]
shapes = [[32768, 4096], [4096, 32768], [8192, 1000], [65536, 128]]
"""
CHROMIUM = Path("/usr/bin/chromium")
ARTEFACT = REPO / "artefacts" / "report.png"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(project, `doit report`'s output) of a project whose instance was built and reported."""
    project = make_project(tmp_path_factory.mktemp("report") / "proj", PROFILE)
    shutil.copytree(REPO / "docs/bench", project / "docs/bench")   # the recorded runs the page plots
    env = {**os.environ, "AICG_CACHE_DIR": str(project / "cache")}
    for name in ("AICG_REMOTE", "AICG_REMOTE_MODE", "AICG_SIGNING_KEY_FILE", "AICG_RECACHE"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "doit", "report", "profile=rulesets/profiles/small.toml"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return project, run.stdout + run.stderr


@pytest.fixture(scope="module")
def instance_dir(built) -> Path:
    return built[0] / "build" / "report"


@pytest.fixture(scope="module")
def page(instance_dir) -> str:
    return (instance_dir / "report.html").read_text(encoding="utf-8")


class Cells(HTMLParser):
    """Every element's data-* attributes, with the text inside it."""

    def __init__(self):
        super().__init__()
        self.found: list[tuple[str, dict, str]] = []
        self._open: list[tuple[str, dict, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("br", "meta", "circle", "line", "rect", "path", "polyline"):
            return
        self._open.append((tag, dict(attrs), []))

    def handle_endtag(self, tag):
        while self._open:
            name, attrs, text = self._open.pop()
            self.found.append((name, attrs, "".join(text)))
            if self._open:
                self._open[-1][2].extend(text)
            if name == tag:
                return

    def handle_data(self, data):
        if self._open:
            self._open[-1][2].append(data)


def cells(html: str) -> list[tuple[str, dict, str]]:
    parser = Cells()
    parser.feed(html)
    return parser.found


def _json(path: Path):
    return json.loads(path.read_text())


def test_doit_report_builds_the_instance_and_writes_the_page(built, instance_dir):
    _, output = built
    assert "wrote build/report/report.html" in output
    assert (instance_dir / "manifest.json").exists() and (instance_dir / "report.html").exists()
    manifest = _json(instance_dir / "manifest.json")
    assert {k["validation"] for k in manifest["kernels"].values()} == {"passed"}, "the record validates them"


def test_each_kernels_time_bandwidth_and_share_of_the_copy_trace_to_the_build(instance_dir, page):
    manifest = _json(instance_dir / "manifest.json")
    copy = _json(instance_dir / "hw/h100-sxm.json")["facts"]["dram_copy_bandwidth"]["value"]
    found = cells(page)
    summary = {a["data-kernel"]: a for tag, a, _ in found if tag == "tr" and "data-kernel" in a}
    assert set(summary) == set(manifest["kernels"])
    for name, kernel in manifest["kernels"].items():
        seconds = [a for tag, a, text in found if tag == "td" and a.get("data-seconds") == repr(kernel["measured_seconds"])]
        assert seconds, f"{name}'s time {kernel['measured_seconds']} is not on the page"
        assert f"{kernel['measured_seconds'] * 1e6:.1f}" in page
        for variant in kernel["dispatch"]:
            timing = next(t for t in _json(instance_dir / f"validation/{variant['candidate']}.json")["timings"]
                          if t["shape"] == [variant["rows"], variant["cols"]])
            assert timing["median_seconds"] == variant["measured_seconds"]
            bandwidth = timing["bytes"] / variant["measured_seconds"]
            shown = [a for tag, a, _ in found if tag == "td" and a.get("data-bytes-per-second") == repr(bandwidth)]
            assert shown, f"{name} at {variant['rows']}x{variant['cols']}: {bandwidth} B/s is not on the page"
            share = [a for tag, a, _ in found if tag == "td" and a.get("data-share") == repr(bandwidth / copy)]
            assert share and f"{bandwidth / copy * 100:.0f}%" in page


def test_every_candidate_is_listed_with_its_time_at_each_shape(instance_dir, page):
    found = cells(page)
    rows = {a["data-candidate"]: text for tag, a, text in found if tag == "tr" and "data-candidate" in a}
    for op in ("softmax", "row_sum"):
        for cand in _json(instance_dir / f"select/{op}.json")["dtypes"]["float32"]["candidates"]:
            assert cand["id"] in rows
            for _, _, seconds in cand["timings"]:
                assert f"{seconds * 1e6:.1f}" in rows[cand["id"]], (cand["id"], seconds)


def test_the_legality_facts_are_said_once_per_rule(instance_dir, page):
    manifest = _json(instance_dir / "manifest.json")
    texts = {fact["text"] for k in manifest["kernels"].values() for facts in k["why"]["rules"].values() for fact in facts}
    shared = {fact["text"] for fact in manifest["kernels"]["softmax.float32"]["why"]["rules"]["vector_loads"]}
    assert shared <= {fact["text"] for fact in manifest["kernels"]["row_sum.float32"]["why"]["rules"]["vector_loads"]}
    from html import escape
    for text in texts:
        assert page.count(escape(text)) == 1, text
    rules = {a["data-rule"] for tag, a, _ in cells(page) if "data-rule" in a}
    assert {r for k in manifest["kernels"].values() for r in k["rules"]} <= rules


def test_the_page_fetches_nothing(page):
    lowered = page.lower()
    for needle in ("http://", "https://", "<script", "<link", "src=", "url(", "@import", "<iframe", "<img"):
        assert needle not in lowered, needle


def test_the_plots_are_there_with_their_marks(instance_dir, page):
    charts = {a["data-chart"] for tag, a, _ in cells(page) if tag == "svg"}
    assert {"lab:softmax.float32", "lab:row_sum.float32"} <= charts
    assert {"probe:working_set.gpu_wide_read", "probe:latency.chase_global"} <= charts
    assert {"bench:rows", "bench:matrix"} <= charts
    copy = _json(instance_dir / "hw/h100-sxm.json")["facts"]["dram_copy_bandwidth"]["value"]
    assert f"copy ceiling {copy / 1e12:.2f} TB/s" in page
    for knee in ("l1_capacity_knee", "l2_capacity_knee", "l2_capacity_latency_knee", "dram_threads_per_sm_90"):
        assert f"{knee} = " in page
    chosen = _json(instance_dir / "manifest.json")["kernels"]["softmax.float32"]["candidate"]
    assert f"chosen: {chosen}" in page
    # the H100 has a recorded row-operator run of its own: no note that another GPU's is shown
    assert "No row-operator benchmark" not in page


def test_a_changed_output_is_read_from_the_store_and_a_lost_one_is_named(built, instance_dir, tmp_path):
    project, _ = built
    copy = Path(shutil.copytree(instance_dir, tmp_path / "inst"))
    select = copy / "select/softmax.json"
    original = select.read_bytes()
    select.write_text(select.read_text().replace('"passed"', '"failed"'))
    store = cas.Store(project / "cache")
    report.write(copy, project / "hwdb", project / "docs/bench", store)
    assert (copy / "report.html").read_text().count('class="status-failed"') == 0
    assert select.read_bytes() != original    # the report reads; it never repairs the build
    with pytest.raises(InputError) as info:
        report.write(copy, project / "hwdb", None, cas.Store(tmp_path / "empty-store"))
    assert "select/softmax.json" in str(info.value) and "run `doit build`" in str(info.value)


def test_without_probe_curves_or_runs_the_page_says_so(instance_dir, tmp_path):
    copy = Path(shutil.copytree(instance_dir, tmp_path / "inst"))
    report.write(copy, tmp_path / "no-hwdb", None)
    text = (copy / "report.html").read_text()
    assert "No probe curves were found" in text and "No benchmark run is recorded" in text


def test_an_instance_not_validated_here_gets_a_page_without_times(instance_dir, tmp_path):
    """Built where no GPU and no record validated it: no time, no bandwidth, and the page says why."""
    copy = Path(shutil.copytree(instance_dir, tmp_path / "inst"))
    shutil.rmtree(copy / ".receipts")     # the files are then read as they are
    shutil.rmtree(copy / "validation")
    manifest = _json(copy / "manifest.json")
    for kernel in manifest["kernels"].values():
        kernel.update(validation="unvalidated", measured_seconds=None, dispatch=[], validated_on=None)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    for op in ("softmax", "row_sum"):
        selection = _json(copy / f"select/{op}.json")
        for cand in selection["dtypes"]["float32"]["candidates"]:
            cand.update(status="unvalidated", measured_seconds=None, timings=[])
        (copy / f"select/{op}.json").write_text(json.dumps(selection))
    report.write(copy, REPO / "hwdb", None)
    text = (copy / "report.html").read_text()
    assert "2 kernels are not validated on the target" in text and "data-seconds" not in text
    assert 'data-chart="lab:softmax.float32"' in text   # the lab's curves stand without the build's times


# ---- the recorded runs and the generated tables ---------------------------------------------------

def _rows_run(path: Path, date: str, device: str, aicg: float, op: str = "softmax") -> None:
    row = {"suite": "acceptance", "op": op, "dtype": "float32", "shape": [4, 8], "bytes": 1000,
           "aicg_kernel": "k", "validation": {"passed": True}, "seconds": {"aicg": aicg, "compile": 2 * aicg},
           "of_copy": 0.5, "peer_over_aicg": {"compile": 2.0}}
    path.write_text(json.dumps({"date": date, "device": device, "torch": "x", "rows": [row]}))


def test_the_latest_run_is_the_latest_date_each_case_from_its_last_run(tmp_path):
    _rows_run(tmp_path / "2026-01-02-a-acceptance-9.json", "2026-01-02", "GPU A", 1e-6)
    _rows_run(tmp_path / "2026-01-02-a-acceptance-10.json", "2026-01-02", "GPU A", 3e-6)
    _rows_run(tmp_path / "2026-01-01-a-acceptance-11.json", "2026-01-01", "GPU A", 5e-6)
    _rows_run(tmp_path / "2026-01-03-b-acceptance.json", "2026-01-03", "GPU B", 7e-6)
    (tmp_path / "2026-01-04-flush-check.json").write_text(json.dumps({"cases": [], "device": "GPU B"}))
    runs = bench.runs(tmp_path)
    assert [r.name for r in bench.latest(runs, bench.ROWS, "GPU A")] == ["2026-01-02-a-acceptance-9.json",
                                                                          "2026-01-02-a-acceptance-10.json"]
    (case,) = bench.row_cases(bench.latest(runs, bench.ROWS, "GPU A"))
    assert case["seconds"]["aicg"] == 3e-6 and case["run"] == "2026-01-02-a-acceptance-10.json"
    assert bench.latest(runs, bench.ROWS)[0].device == "GPU B"
    headline = tables.readme_headline(runs, tmp_path)
    assert "GPU B, 2026-01-03" in headline and "| softmax | 50-50% | - | 2.00 | - |" in headline


def test_a_run_that_is_not_json_is_named(tmp_path):
    (tmp_path / "2026-01-01-x.json").write_text("{not json")
    with pytest.raises(InputError) as info:
        bench.runs(tmp_path)
    assert "2026-01-01-x.json" in str(info.value)


def test_the_matrix_headline_traces_to_the_recorded_table(tmp_path):
    table = [{"stage": "square", "problem": "64x32x16 bfloat16 kk plain", "aicg_tflops": 500.0, "aicg_kernel": "w",
              "peer": "F.linear (cuBLAS)", "peer_tflops": 400.0, "peer_error": None}]
    (tmp_path / "2026-02-01-g-matmul.json").write_text(json.dumps(
        {"device": {"name": "GPU G"}, "hwdb": "h100-sxm", "table": table, "summary": {}, "cases": []}))
    headline = tables.readme_headline(bench.runs(tmp_path), REPO / "hwdb")
    peak = tables.tensor_peak(bench.runs(tmp_path)[0], REPO / "hwdb", "bfloat16")[0]
    assert f"| 64×32×16, B as N×K (F.linear) | 500 | {500e12 / peak * 100:.0f}% | F.linear (cuBLAS) | 400 | 1.25 |" in headline
    assert "GPU G, 2026-02-01" in headline


def test_log_ticks_are_powers_and_labels_short():
    assert svg.Scale(1, 40000, log=True).ticks(8) == [1, 4, 16, 64, 256, 1024, 4096, 16384]
    assert svg.number(100000000) == "1e8" and svg.number(4096) == "4096" and svg.number(2.5) == "2.5"
    assert svg.binary_size(3 * 2 ** 20) == "3 MiB"
    assert svg.Scale(0, 10).ticks(5) == [0, 2.5, 5, 7.5, 10]


# ---- headless Chromium --------------------------------------------------------------------------

def decode_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG as a (height, width, channels) array: zlib, then the five
    filters undone along anti-diagonals (a pixel needs its left, upper and upper-left ones)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour in (2, 6), header
    channels = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, width * channels + 1)
    filters, filtered = raw[:, 0], raw[:, 1:].astype(np.int32).reshape(height, width, channels)
    out = np.zeros((height + 1, width + 1, channels), np.int32)   # a zero row above, a zero column left
    for k in range(height + width - 1):
        y = np.arange(max(0, k - width + 1), min(height, k + 1))
        x = k - y
        a, b, c = out[y + 1, x], out[y, x + 1], out[y, x]
        kind = filters[y][:, None]
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        predicted = np.select([kind == 1, kind == 2, kind == 3, kind == 4], [a, b, (a + b) // 2, paeth], 0)
        out[y + 1, x + 1] = (filtered[y, x] + predicted) & 255
    return out[1:, 1:, :3].astype(np.uint8)


def _hex(colour: str) -> np.ndarray:
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])


def plot_areas(image: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(top, bottom, left, right) of every region filled with the plots' background colour (the
    grid lines and the data across it cut it into cells: gaps of a few pixels are bridged)."""
    mask = (image == _hex(svg.PLOT_BACKGROUND)).all(axis=2)
    boxes = []
    for top, bottom in _runs(mask.sum(axis=1) > 40):
        for left, right in _runs(mask[top:bottom].sum(axis=0) > 0.3 * (bottom - top)):
            if bottom - top > 60 and right - left > 60:
                boxes.append((top, bottom, left, right))
    return boxes


def _runs(flags, gap: int = 8) -> list[tuple[int, int]]:
    """[start, end) of the runs of true flags, runs fewer than `gap` apart joined."""
    out: list[list[int]] = []
    for i, flag in enumerate(flags):
        if flag:
            if out and i - out[-1][1] < gap:
                out[-1][1] = i + 1
            else:
                out.append([i, i + 1])
    return [(a, b) for a, b in out]


def test_headless_chromium_shows_the_plots(instance_dir, tmp_path):
    if not CHROMIUM.exists():
        if os.environ.get("AICG_REQUIRE_CHROMIUM"):
            pytest.fail(f"AICG_REQUIRE_CHROMIUM is set and there is no {CHROMIUM}")
        pytest.skip(f"no {CHROMIUM} (Debian's chromium package; .ci/run installs it)")
    shot = tmp_path / "report.png"
    run = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                          "--window-size=1200,2400", (instance_dir / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists(), run.stdout + run.stderr
    ARTEFACT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTEFACT)
    image = decode_png(shot.read_bytes())
    assert image.shape[:2] == (2400, 1200)
    dark = (image.sum(axis=2) < 384).mean()
    assert 0.005 < dark < 0.5, f"{dark:.2%} of the page is dark: blank, or not the page"
    boxes = plot_areas(image)
    assert len(boxes) >= 2, f"the lab's two plots should show: found plot areas {boxes}"
    for top, bottom, left, right in boxes:
        region = image[top:bottom, left:right].astype(int)
        near = lambda colour: (np.abs(region - _hex(colour)).sum(axis=2) < 60).sum()
        assert near(svg.BLUE) > 50, f"no best-of-the-lab line in the plot at {top}..{bottom}, {left}..{right}"
        assert near(svg.GREY) + near(svg.VERMILION) + near(svg.GREEN) > 50, "no realisations in the plot"


def _matrix_run(path, stage: str, problem: str, aicg: float, flush: str | None = None, exploration: str = ""):
    table = [{"stage": stage, "problem": problem, "aicg_tflops": aicg, "aicg_kernel": "w",
              "peer": "F.linear (cuBLAS)", "peer_tflops": 400.0, "peer_error": None}]
    args = {"stages": [stage], **({"flush": flush} if flush else {})}
    path.write_text(json.dumps({"device": {"name": "GPU G"}, "hwdb": "h100-sxm", "table": table, "summary": {},
                                "cases": [], "args": args, **({"exploration": exploration} if exploration else {})}))


def test_each_matrix_case_comes_from_the_last_run_holding_it_and_a_memset_or_exploration_is_no_figure(tmp_path):
    _matrix_run(tmp_path / "2026-02-01-g-matmul.json", "square", "64x32x16 bfloat16 kk plain", 500.0)
    _matrix_run(tmp_path / "2026-02-01-g-matmul-grid.json", "grid", "1x32x16 bfloat16 kk plain", 1.0)
    _matrix_run(tmp_path / "2026-02-02-g-matmul-grid.json", "grid", "1x32x16 bfloat16 kk plain", 2.0)
    _matrix_run(tmp_path / "2026-02-03-g-matmul-memset.json", "grid", "1x32x16 bfloat16 kk plain", 3.0, flush="write")
    _matrix_run(tmp_path / "2026-02-04-g-matmul-untried.json", "grid", "1x32x16 bfloat16 kk plain", 0.5,
                exploration="some untried settings alone")
    day = bench.latest(bench.runs(tmp_path), bench.MATRIX)
    assert [r.name for r in day] == ["2026-02-01-g-matmul.json", "2026-02-02-g-matmul-grid.json"]
    cases = {c["stage"]: c["aicg_tflops"] for c in bench.matrix_cases(day)}
    assert cases == {"square": 500.0, "grid": 2.0}   # the grid of 02-02 replaces 02-01's; 02-03's and 02-04's are no figure
    assert "square 2026-02-01; grid 2026-02-02" in tables.readme_headline(bench.runs(tmp_path), REPO / "hwdb")
    # a later run of one square case adds it and leaves the stage's other case as it was
    _matrix_run(tmp_path / "2026-02-05-g-matmul-square.json", "square", "128x32x16 bfloat16 kk plain", 600.0)
    day = bench.latest(bench.runs(tmp_path), bench.MATRIX)
    squares = {c["problem"]: c["aicg_tflops"] for c in bench.matrix_cases(day) if c["stage"] == "square"}
    assert squares == {"64x32x16 bfloat16 kk plain": 500.0, "128x32x16 bfloat16 kk plain": 600.0}
    assert len(day) == 3
    assert "square 2026-02-01, 2026-02-05" in tables.readme_headline(bench.runs(tmp_path), REPO / "hwdb")
