"""Every backward kernel compiles with NVRTC for sm_90 and sm_80 without spilling: each family at
every rung of its ladder (the dtypes taking turns, so that each family meets each dtype on each
target), its column sums beside it; and the generated entries take their arguments in the order
the launches pass them. CPU only."""
from __future__ import annotations

import re

import pytest

from aicg import nvrtc
from aicg.codegen import blocks_per_row
from aicg.backward import build, codegen, space
from aicg.backward.space import Candidate

DTYPES = ("float32", "bfloat16", "float16")
SPACE = space.shipped()
ROW_FAMILIES = [name for name, f in SPACE.families.items() if f.part == "rows"]


def _candidates(family_name: str, turn: int) -> list[Candidate]:
    family = SPACE.families[family_name]
    columns = SPACE.families[family.columns or "column_sum_two_pass"]
    has_columns = "columns" in SPACE.parts[family.op]
    found = []
    for i, rung in enumerate(family.ladder):
        column_rung = columns.ladder[i % len(columns.ladder)]
        found.append(Candidate(family.op, DTYPES[(i + turn) % len(DTYPES)], family_name, dict(rung.params),
                               columns.name if has_columns else None, dict(column_rung.params) if has_columns else None,
                               family.columns is not None))
    return found


@pytest.mark.parametrize("arch, turn", [("sm_90", 0), ("sm_80", 1)])
@pytest.mark.parametrize("family", ROW_FAMILIES)
def test_every_rung_compiles_without_spilling(family, arch, turn):
    for candidate in _candidates(family, turn):
        if arch == "sm_80" and blocks_per_row(candidate.rows["topology"]) > 1:
            continue    # clusters are sm_90's: a GPU without them is never offered these (test_backward_space)
        cubin, reports, log = build.compile_candidate(SPACE, candidate, arch)
        assert cubin and set(reports) == set(codegen.entries(candidate)), log
        assert not build.unhealthy(candidate, reports), (candidate.id, arch, log)


def _parameters(source: str, entry: str) -> list[str]:
    signature = source.split(f"\n{entry}(", 1)[1].split(")", 1)[0]
    return re.findall(r"(\w+)\s*(?:,|$)", signature.strip())


@pytest.mark.parametrize("family", ROW_FAMILIES)
def test_each_entry_declares_the_arguments_its_launches_pass(family):
    candidate = _candidates(family, 0)[-1]
    source = codegen.source(SPACE, candidate)
    for entry, names in codegen.arguments(candidate).items():
        assert _parameters(source, entry) == list(names), entry
    launches = [codegen.rows_launch(SPACE, candidate, 1000, 4096),
                *codegen.column_launches(SPACE, candidate, 1000, 4096)]
    assert [launch.entry for launch in launches] == list(codegen.entries(candidate))
    assert all(launch.arguments == codegen.arguments(candidate)[launch.entry] for launch in launches)


def test_the_column_passes_tile_every_column_and_chunk_every_row():
    candidate = _candidates("layernorm_backward_rows", 1)[3]
    rows, cols = 3001, 1000
    partials, totals = codegen.column_launches(SPACE, candidate, rows, cols)
    c = candidate.columns
    width = c["col_lanes"] * c["vec_bytes"] // 2     # bfloat16 packs
    assert partials.grid[0] * width >= cols > (partials.grid[0] - 1) * width
    chunk, chunks = codegen.column_values(SPACE, candidate, rows).values()
    assert partials.grid[1] == chunks and chunk * chunks >= rows > chunk * (chunks - 1)
    assert totals.grid[0] * c["col_lanes"] * 4 >= cols and totals.block == partials.block == c["threads"]
    assert codegen.workspace_floats(SPACE, candidate, rows, cols) == {"stats": 2 * rows, "partials": 2 * chunks * cols}


def test_the_compile_key_follows_the_headers_bytes(tmp_path, repo):
    import shutil
    candidate = _candidates("softmax_backward_rows", 0)[0]
    kernels = shutil.copytree(repo / "kernels", tmp_path / "kernels")
    key = build.compile_key(SPACE, candidate, "sm_90", kernels)
    assert key == build.compile_key(SPACE, candidate, "sm_90")
    assert key != build.compile_key(SPACE, candidate, "sm_80")
    (kernels / "backward/rows.cuh").write_text((kernels / "backward/rows.cuh").read_text() + "\n// edited\n")
    assert build.compile_key(SPACE, candidate, "sm_90", kernels) != key
    assert "backward/rows.cuh" in codegen.headers(SPACE, candidate) and "reduce.cuh" in codegen.headers(SPACE, candidate)


def test_a_compile_error_points_at_the_template(tmp_path, repo):
    import shutil
    from aicg.errors import CompileError
    candidate = _candidates("softmax_backward_rows", 0)[0]
    kernels = shutil.copytree(repo / "kernels", tmp_path / "kernels")
    header = kernels / "backward/softmax.cuh"
    header.write_text(header.read_text().replace("s = row_reduce", "s = row_reduced", 1))
    with pytest.raises(CompileError, match=r"kernels/backward/softmax\.cuh\(\d+\)"):
        build.compile_candidate(SPACE, candidate, "sm_90", kernels)
    assert nvrtc.compilations > 0
