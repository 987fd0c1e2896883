"""The matrix family's parameter space (aicg/matrix/space.py, space.toml) and each template's
constraints (aicg/matrix/templates/): which knob settings a GPU can run, and why not."""
from __future__ import annotations

import json

import pytest

from aicg import hw
from aicg.errors import InputError
from aicg.matrix import space
from aicg.matrix.problem import Problem
from aicg.matrix.space import Epilogue
from aicg.matrix.templates import RULES, GpuLimits


@pytest.fixture(scope="module")
def hopper(repo):
    return GpuLimits.of_hardware(hw.load(repo / "hwdb" / "h100-sxm.toml"))


@pytest.fixture(scope="module")
def ampere(repo):
    return GpuLimits.of_hardware(hw.load(repo / "hwdb" / "a100-sxm4-80gb.toml"))


@pytest.fixture(scope="module")
def ada(repo):
    return GpuLimits.of_hardware(hw.load(repo / "hwdb" / "l4.toml"))


def legal(template, limits, **fixed):
    """Knob settings of `template` (bf16, A and B K-major unless `fixed` says) legal under `limits`."""
    a, b = fixed.pop("a", "k"), fixed.pop("b", "k")
    found = []
    for knobs in space.knob_settings(template):
        if any(knobs[k] != v for k, v in fixed.items()):
            continue
        real = space.realisation(template, "bfloat16", a, b, Epilogue(), **knobs)
        if not RULES[template].violations(real, limits):
            found.append(real)
    return found


def test_templates_read_from_space_toml():
    tpls = space.templates()
    assert set(tpls) == {"wgmma", "mma", "gemv"}
    assert tpls["wgmma"].header == "matrix/gemm_wgmma.cuh" and tpls["wgmma"].compute_capability == (9, 0)
    assert tpls["wgmma"].runs_on((9, 0)) and not tpls["wgmma"].runs_on((10, 0)) and not tpls["wgmma"].runs_on((8, 9))
    assert tpls["mma"].runs_on((8, 0)) and tpls["mma"].runs_on((9, 0)) and not tpls["mma"].runs_on((7, 5))
    assert tpls["gemv"].a_layouts == ("k",) and tpls["gemv"].b_layouts == ("k",)
    assert all(tpls[t].tried for t in tpls)


def test_every_tried_setting_is_legal_where_its_template_runs(hopper, ampere):
    for name, tpl in space.templates().items():
        for knobs in tpl.tried:
            real = space.realisation(name, "bfloat16", "k", "k", Epilogue(), **knobs)
            assert RULES[name].violations(real, hopper) == [], (name, knobs)
            if name != "wgmma" and knobs.get("spread") != "bulk":
                assert RULES[name].violations(real, ampere) == [], (name, knobs)
            elif name == "gemv":   # the bulk spread's copies are sm_90's
                assert any("compute capability 9.0" in v for v in RULES[name].violations(real, ampere))


def test_realisation_names_are_unique_and_say_their_knobs():
    reals = [space.realisation("wgmma", "bfloat16", a, b, Epilogue(), **k)
             for k in space.knob_settings("wgmma") for a in ("k", "mn") for b in ("k", "mn")]
    names = {r.name for r in reals}
    assert len(names) == len(reals)
    r = space.realisation("wgmma", "float16", "k", "mn", Epilogue("gelu_tanh", True, True),
                          **space.templates()["wgmma"].tried[1])
    assert r.name == "wgmma.f16.kmn.bm128_bn256_c2_g8_rm_coop_k1_s4_direct.bias+gelu_tanh+residual"
    assert space.Realisation.from_dict(r.as_dict()) == r


def test_a_decode_record_from_before_the_spread_knob_reads_as_splits_under_its_old_name(repo):
    """Decode records measured before the knob (hwdb/<gpu>.matrix.json's first ones) name no spread:
    they used the splits."""
    records = json.loads((repo / "hwdb" / "h100-sxm.matrix.json").read_text())["records"]
    old = next(r["realisation"] for r in records if r["realisation"]["template"] == "gemv"
               and r["realisation"]["knobs"].get("spread", "splits") == "splits")
    old = dict(old, knobs={name: v for name, v in old["knobs"].items() if name != "spread"})
    real = space.Realisation.from_dict(old)
    assert real.knob("spread") == "splits"
    k = old["knobs"]
    assert real.name == f"gemv.bf16.kk.rg{k['ring']}_t{k['tiles']}_u{k['unroll']}_w{k['warps']}.plain"
    even = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **dict(k, spread="even"))
    assert even.name == f"gemv.bf16.kk.rg{k['ring']}_even_t{k['tiles']}_u{k['unroll']}_w{k['warps']}.plain"
    assert space.Realisation.from_dict(even.as_dict()) == even
    names = [space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **s).name for s in space.knob_settings("gemv")]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("earlier, message", [('spread = "halves"', "one of"), ("colour = 1", "a knob of the template")])
def test_space_toml_earlier_values_are_knobs_of_the_template(tmp_path, raises_input_error, earlier, message):
    path = tmp_path / "space.toml"
    path.write_text(space.SPACE_FILE.read_text().replace('[templates.gemv.earlier]\nspread = "splits"',
                                                         f"[templates.gemv.earlier]\n{earlier}", 1))
    key = "templates.gemv.earlier." + earlier.split(" ")[0]
    with raises_input_error(path, key, message):
        space.templates(path)


@pytest.mark.parametrize("change, message", [
    ({"block_m": 96}, "knob block_m = 96"), ({"stages": True}, "knob stages = True"),
    ({"tiles": 2}, "unknown ['tiles']"), ({"group": None}, "knob group = None")])
def test_realisation_rejects_knobs_outside_the_domain(change, message):
    knobs = dict(space.templates()["wgmma"].tried[0], **change)
    if change.get("tiles"):
        knobs.pop("tiles")
        knobs["tiles"] = 2
    with pytest.raises(ValueError) as err:
        space.realisation("wgmma", "bfloat16", "k", "k", Epilogue(), **knobs)
    assert message in str(err.value)


def test_realisation_rejects_layouts_dtypes_and_activations_it_does_not_take():
    with pytest.raises(ValueError, match="takes A layouts"):
        space.realisation("gemv", "bfloat16", "mn", "k", Epilogue(), **space.templates()["gemv"].tried[0])
    with pytest.raises(ValueError, match="the matrix family takes bfloat16, float16"):
        space.realisation("gemv", "float32", "k", "k", Epilogue(), **space.templates()["gemv"].tried[0])
    with pytest.raises(ValueError, match="activation 'relu'"):
        Epilogue("relu")


def test_space_toml_errors_name_file_and_key(tmp_path, raises_input_error):
    path = tmp_path / "space.toml"
    stages = "stages = [2, 3, 4, 5, 6, 7, 8]"
    text = space.SPACE_FILE.read_text().replace(stages, stages + "\ncolour = 3", 1)
    path.write_text(text)
    with pytest.raises(InputError) as err:
        space.templates(path)
    assert "templates.wgmma.knobs.colour" in str(err.value)
    bad = space.SPACE_FILE.read_text().replace("block_m = 128\nblock_n = 256\nstages = 4", "block_m = 96\nblock_n = 256\nstages = 4", 1)
    path.write_text(bad)
    with raises_input_error(path, "templates.wgmma.tried[0]", "a value for each knob"):
        space.templates(path)


def wgmma(a="k", b="k", epilogue=Epilogue(), **knobs):
    """A wgmma realisation: the first tried setting with `knobs` changed."""
    return space.realisation("wgmma", "bfloat16", a, b, epilogue, **dict(space.templates()["wgmma"].tried[0], **knobs))


def test_wgmma_shared_memory_and_accumulators_decide_the_legal_tiles(hopper):
    rules = RULES["wgmma"]
    reals = legal("wgmma", hopper, cluster_m=1, raster="m", group=8, split_k=1)
    by_tile = {}
    for r in reals:
        key = (r.knob("schedule"), r.knob("store"), r.knob("block_m"), r.knob("block_n"))
        by_tile.setdefault(key, []).append(r.knob("stages"))
    # cooperative, direct stores: 128 x 256 takes 48 KiB a stage, 4 stages fit the 227 KiB opt-in, 5 do not
    assert max(by_tile[("cooperative", "direct", 128, 256)]) == 4
    assert max(by_tile[("cooperative", "direct", 128, 128)]) == 7
    assert max(by_tile[("cooperative", "direct", 256, 128)]) == 4
    # the staged epilogue's buffers (a result block a consumer, 64 KiB for 128 x 256) cost a stage
    assert max(by_tile[("cooperative", "staged", 128, 256)]) == 3
    assert max(by_tile[("pingpong", "staged", 128, 128)]) == 5
    assert max(by_tile[("pingpong", "staged", 64, 256)]) == 4
    # a cooperative consumer holds half the rows, a pingpong consumer all of them: 256 accumulators
    # a thread for 256 x 256 cooperative or 128 x 256 pingpong; 32-row consumers for 64 cooperative
    for schedule, bm, bn in [("cooperative", 256, 256), ("pingpong", 128, 256), ("pingpong", 256, 128),
                             ("cooperative", 64, 128)]:
        assert not any(k[0] == schedule and k[2:] == (bm, bn) for k in by_tile), (schedule, bm, bn)
    bad = wgmma(block_m=256, block_n=256, stages=2)
    assert any("256 accumulators" in v for v in rules.violations(bad, hopper))
    assert any("consumers of 32 rows" in v for v in rules.violations(wgmma(block_m=64, block_n=64), hopper))
    five = wgmma(stages=5)
    assert rules.dynamic_shared_bytes(five) == 5 * 384 * 128 + 1024
    assert any("shared memory" in v for v in rules.violations(five, hopper))


def test_wgmma_staging_buffers_are_counted_with_the_bias():
    rules = RULES["wgmma"]
    ring = 4 * (128 + 128) * 128 + 1024
    pingpong = wgmma(block_m=128, block_n=128, schedule="pingpong", store="staged")
    assert rules.dynamic_shared_bytes(pingpong) == ring + 2 * 128 * 128 * 2
    biased = wgmma(block_m=128, block_n=128, schedule="pingpong", store="staged", epilogue=Epilogue(bias=True))
    assert rules.dynamic_shared_bytes(biased) == ring + 2 * (128 * 128 * 2 + 128 * 2)
    cooperative = wgmma(block_m=128, block_n=128, store="staged")
    assert rules.dynamic_shared_bytes(cooperative) == ring + 2 * 64 * 128 * 2
    assert rules.dynamic_shared_bytes(wgmma(block_m=128, block_n=128)) == ring


def test_a_handed_off_epilogue_is_cooperative_unsplit_and_counts_its_buffers(hopper):
    rules = RULES["wgmma"]
    handoff = wgmma(block_m=128, block_n=256, stages=3, store="handoff", epilogue=Epilogue(bias=True))
    # a consumer's rows x block_n rounded sums and two mbarriers each; the bias is read from global memory
    assert rules.dynamic_shared_bytes(handoff) == 3 * (128 + 256) * 128 + 1024 + 2 * (64 * 256 * 2 + 16)
    assert rules.violations(handoff, hopper) == []
    assert rules.rounds_sum(handoff) and not rules.rounds_sum(wgmma(store="staged"))
    assert rules.template_arguments(handoff)[12:] == ["aicg::matrix::SCHEDULE_COOPERATIVE",
                                                      "aicg::matrix::STORE_HANDOFF"]
    for other in (wgmma(block_m=128, block_n=128, schedule="pingpong", store="handoff"),
                  wgmma(block_m=128, block_n=128, store="handoff", split_k=2)):
        assert any("cooperative schedule's units, with K unsplit" in v for v in rules.violations(other, hopper))
    assert any("whole 128-byte lines" in v for v in rules.violations(wgmma(block_n=96, store="handoff"), hopper))


def test_wgmma_instantiation_leaves_default_trailing_knobs_to_the_template():
    rules = RULES["wgmma"]
    base = rules.template_arguments(wgmma())
    assert base[-3:] == ["aicg::matrix::ACT_NONE", "false", "false"] and len(base) == 12
    assert rules.template_arguments(wgmma(schedule="pingpong", block_n=128))[12:] == \
        ["aicg::matrix::SCHEDULE_PINGPONG"]
    assert rules.template_arguments(wgmma(store="staged"))[12:] == \
        ["aicg::matrix::SCHEDULE_COOPERATIVE", "aicg::matrix::STORE_STAGED"]
    assert rules.template_arguments(wgmma(split_k=4))[12:] == \
        ["aicg::matrix::SCHEDULE_COOPERATIVE", "aicg::matrix::STORE_DIRECT", "4"]


def test_wgmma_needs_exactly_hopper_and_whole_box_shares(hopper, ampere):
    real = wgmma("k", "mn", block_m=128, block_n=192, stages=3, cluster_m=2)
    found = RULES["wgmma"].violations(real, hopper)
    assert found == ["3 boxes of B do not split over 2 CTAs"]
    k_major = wgmma(block_m=128, block_n=192, stages=3, cluster_m=2)
    assert RULES["wgmma"].violations(k_major, hopper) == []
    assert any("compute capability 9.0 only" in v for v in RULES["wgmma"].violations(k_major, ampere))


def test_a_cluster_along_n_shares_a_and_pads_the_tile_columns(hopper):
    """Four CTAs on horizontally adjacent tiles: each copies a quarter of A's slice to all four (its
    tensor map's box a quarter of the tile's rows), the tile columns are padded to whole clusters
    (their results never stored), and the launch is whole clusters of four."""
    from aicg.matrix import tensormap
    rules = RULES["wgmma"]
    real = wgmma(block_m=128, block_n=48, stages=8, cluster_n=4)
    assert rules.violations(real, hopper) == [] and rules.cluster(real) == 4
    assert real.name == "wgmma.bf16.kk.bm128_bn48_c1_cn4_g8_rm_coop_k1_s8_direct.plain"
    assert rules.template_arguments(real)[12:] == ["aicg::matrix::SCHEDULE_COOPERATIVE", "aicg::matrix::STORE_DIRECT",
                                                  "1", "4"]
    problem = Problem(128, 6000, 4096)           # 125 tiles of 48 columns, 128 once padded to clusters
    work = rules.work(real, problem)
    assert (work.tiles_m, work.tiles_n, work.units) == (1, 128, 128)
    geometry = rules.geometry(real, problem, 132, None)
    assert geometry.grid == (128, 1, 1) and geometry.cluster == 4
    assert tensormap.spec(real, problem, "a").box == (64, 32) and tensormap.spec(real, problem, "b").box == (64, 48)
    # a realisation from before the knob reads as unclustered along N, under its old name
    old = space.Realisation.from_dict({**wgmma().as_dict(), "knobs": dict(space.templates()["wgmma"].tried[0])})
    assert old.knob("cluster_n") == 1 and "_cn" not in old.name


@pytest.mark.parametrize("knobs, a, b, message", [
    (dict(cluster_m=2, cluster_n=2), "k", "k", "along M or along N, not both"),
    (dict(block_m=64, schedule="pingpong", cluster_n=4, block_n=64, stages=4), "mn", "k",
     "1 boxes of A do not split over 4 CTAs"),
    (dict(block_n=48, store="staged"), "k", "k", "whole 128-byte lines: 48 columns"),
    (dict(block_n=96), "k", "mn", "boxes of 64 columns, not 96"),
])
def test_what_a_narrow_band_or_a_cluster_along_n_cannot_be(knobs, a, b, message, hopper):
    found = RULES["wgmma"].violations(wgmma(a, b, **knobs), hopper)
    assert any(message in v for v in found), found


def test_mma_constraints(hopper, ada):
    rules = RULES["mma"]
    reals = legal("mma", hopper, block_k=32, aligned=True, raster="m", group=8, stages=3)
    assert reals and all(rules.accumulators(r) <= 128 for r in reals)
    one_warp = space.realisation("mma", "bfloat16", "k", "k", Epilogue(), block_m=128, block_n=128, block_k=32,
                                 warps_m=1, warps_n=1, stages=2, aligned=True, raster="m", group=8)
    assert any("512 accumulators" in v for v in rules.violations(one_warp, hopper))
    # the same tile, deeper ring: fits the H100's 227 KiB, not the L4's 99 KiB
    deep = space.realisation("mma", "bfloat16", "k", "k", Epilogue(), block_m=256, block_n=256, block_k=64,
                             warps_m=4, warps_n=4, stages=4, aligned=True, raster="m", group=8)
    assert rules.dynamic_shared_bytes(deep) == 4 * 2 * (256 * 72 + 256 * 72)
    assert any("shared memory" in v for v in rules.violations(deep, hopper))
    deep3 = space.realisation("mma", "bfloat16", "k", "k", Epilogue(), block_m=128, block_n=256, block_k=64,
                              warps_m=2, warps_n=4, stages=3, aligned=True, raster="m", group=8)
    assert rules.violations(deep3, hopper) == [] and any("shared memory" in v for v in rules.violations(deep3, ada))
    # the MN-major layouts pad the other dimension
    mn = space.realisation("mma", "bfloat16", "mn", "mn", Epilogue(), **space.templates()["mma"].tried[0])
    assert rules.dynamic_shared_bytes(mn) == 4 * 2 * (32 * 136 + 32 * 136)


def test_gemv_register_estimate_rules_out_the_widest_settings(hopper):
    reals = legal("gemv", hopper, ring=0)
    settings = {(r.knob("tiles"), r.knob("unroll")) for r in reals}
    assert (4, 8) not in settings and (1, 8) in settings and (4, 4) in settings


def test_gemv_ring_trades_registers_for_shared_memory(hopper, ada):
    rules = RULES["gemv"]
    base = dict(space.templates()["gemv"].tried[0])
    ring = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **dict(base, warps=4, tiles=4, unroll=8, ring=3))
    # W's vectors once in registers, not twice: the widest group fits where it did not
    assert rules.registers_estimate(ring) == 4 * 4 * 8 + 8 + 16 + 40
    assert rules.dynamic_shared_bytes(ring) == 4 * 3 * 8 * 4 * 32 * 16 == 196608
    assert rules.violations(ring, hopper) == [] and any("shared memory" in v for v in rules.violations(ring, ada))
    assert rules.template_arguments(ring)[-1] == "3"
    plain = space.realisation("gemv", "bfloat16", "k", "k", Epilogue(), **base)
    assert rules.dynamic_shared_bytes(plain) == 0 and rules.template_arguments(plain)[-1] == "false"
    g = rules.geometry(ring, Problem(1, 4096, 4096), 132, None)
    assert g.shared_bytes == 196608 and rules.blocks_per_sm_estimate(ring) == 1


def test_legal_space_sizes(hopper):
    """The space the opt-in full compile covers (tests/test_matrix_build.py): every legal knob setting."""
    assert 12000 < len(legal("wgmma", hopper)) < 24000
    assert 50 < len(legal("mma", hopper)) < 1500
    assert 3 * 40 < len(legal("gemv", hopper)) <= 3 * 72    # each setting with every spread


# ---- what ptxas made of the settings tried first (NVRTC on this machine, sm_90a)

FUSED = Epilogue("gelu_erf", bias=True, residual=True)
NEW_WGMMA = [i for i, k in enumerate(space.templates()["wgmma"].tried)
             if (k["schedule"], k["store"], k["split_k"]) != ("cooperative", "direct", 1)]


@pytest.fixture(scope="module")
def sass(bench_module):
    return bench_module("sass")


@pytest.mark.parametrize("i, epilogue", [(i, FUSED) for i in NEW_WGMMA] + [(NEW_WGMMA[0], Epilogue())],
                         ids=lambda v: v.name if isinstance(v, Epilogue) else str(v))
def test_staged_pingpong_and_split_settings_compile_to_their_design(i, epilogue, hopper, sass):
    """Every tried setting with a staged epilogue, the pingpong schedule or split-K: within the
    GPU's limits, no spills or stack, the launch bound's 168 registers (setmaxnreg then moves
    them), and in the SASS what the design rests on: one HGMMA per m64 row block and k16 step of
    a consumer, 16-byte stores of C in both of its copy-outs (staged), the residual fetched by cp.async, the ticket taken
    by an atomic (split-K)."""
    from collections import Counter
    from aicg.matrix import build
    real = space.realisation("wgmma", "bfloat16", "k", "k", epilogue, **space.templates()["wgmma"].tried[i])
    k = real.settings
    assert RULES["wgmma"].violations(real, hopper) == []
    built = build.compile_realisation(real, "sm_90a")
    assert build.healthy(built) == [], built.report
    assert built.report["registers"] == 168
    ops = Counter(x.opcode for x in sass.parse(sass.disassemble(built.cubin))[0])
    consumer_rows = k["block_m"] if k["schedule"] == "pingpong" else k["block_m"] // 2
    assert sum(n for op, n in ops.items() if op.startswith("HGMMA")) == consumer_rows // 64 * 4
    assert ops["USETMAXREG.DEALLOC.CTAPOOL"] == 1 and ops["USETMAXREG.TRY_ALLOC.CTAPOOL"] == 1
    assert not any(op.startswith(("LDL", "STL")) for op in ops)
    if k["store"] == "staged":
        chunks = consumer_rows * k["block_n"] // 8 // 128      # 16-byte chunks a consumer thread stores
        assert ops["STG.E.128"] == 2 * chunks   # in each copy-out: a block wholly inside C, and one clipped
        if epilogue.residual:
            assert ops["LDGSTS.E.BYPASS.128.ZFILL"] >= chunks
    assert (ops["ATOMG.E.ADD.STRONG.GPU"] == 1) == (k["split_k"] > 1)


HANDOFF = [dict(space.templates()["wgmma"].tried[0], stages=3, store="handoff"),
           dict(space.templates()["wgmma"].tried[0], block_m=256, block_n=128, stages=3, cluster_m=2, store="handoff")]


@pytest.mark.parametrize("knobs", HANDOFF, ids=lambda k: f"{k['block_m']}x{k['block_n']}_c{k['cluster_m']}")
@pytest.mark.parametrize("dtype, epilogue", [("bfloat16", Epilogue()), ("bfloat16", FUSED),
                                             ("float16", Epilogue("silu", residual=True))], ids=str)
def test_handed_off_settings_compile_to_their_design(knobs, dtype, epilogue, hopper, sass):
    """The handoff store: no spills or stack on either side of setmaxnreg (ptxas holds the producer
    warpgroup, whose warps now finish the epilogue, to 136 registers and the consumers to 184), the
    consumers' HGMMAs, no cp.async (the drainers read the residual themselves), and 16-byte stores of C
    on the drainers' vector path."""
    from collections import Counter
    from aicg.matrix import build
    real = space.realisation("wgmma", dtype, "k", "k", epilogue, **knobs)
    assert RULES["wgmma"].violations(real, hopper) == []
    built = build.compile_realisation(real, "sm_90a")
    assert build.healthy(built) == [], built.report
    assert built.report["registers"] == 168
    ops = Counter(x.opcode for x in sass.parse(sass.disassemble(built.cubin))[0])
    assert sum(n for op, n in ops.items() if op.startswith("HGMMA")) == knobs["block_m"] // 2 // 64 * 4
    assert ops["USETMAXREG.DEALLOC.CTAPOOL"] == 1 and ops["USETMAXREG.TRY_ALLOC.CTAPOOL"] == 1
    assert not any(op.startswith(("LDL", "STL", "LDGSTS")) for op in ops)
    assert ops["STG.E.128"] >= 1


def test_a_clustered_release_is_no_fence(sass):
    """A consumer frees a slot in both CTAs of a cluster in every K slice: the remote arrival is a
    barrier operation alone, with no memory barrier before it (a GPU-wide MEMBAR there stalls
    every consumer in every slice)."""
    from aicg.matrix import build
    knobs = next(k for k in space.templates()["wgmma"].tried if k["cluster_m"] == 2)
    real = space.realisation("wgmma", "bfloat16", "k", "k", Epilogue(), **knobs)
    ops = [x.opcode for x in sass.parse(sass.disassemble(build.compile_realisation(real, "sm_90a").cubin))[0]]
    remote = [i for i, op in enumerate(ops) if op.startswith("SYNCS.ARRIVE.TRANS64.RED")]
    first_mma = min(i for i, op in enumerate(ops) if op.startswith("HGMMA"))
    assert remote and remote[-1] > first_mma
    # the K loop and its releases hold no fence (the cluster's barriers at start and end keep theirs)
    assert not any(op.startswith("MEMBAR") for op in ops[first_mma:remote[-1] + 1])


def test_unmeasured_knob_values_are_planned_only_as_the_space_tries_them():
    """Clusters along N and narrow bands reach the planner in the space's tried
    settings only, not in every combination of the modelled knobs (the calibration cannot carry
    an effect nobody measured)."""
    from aicg.matrix import plan, prior
    tried = [tuple(sorted(k.items())) for k in space.templates()["wgmma"].tried]
    planned = list(plan.settings("wgmma"))
    unmeasured = [s for s in planned if any(s[n] in values for n, values in prior.TRIED_ONLY_VALUES["wgmma"].items())]
    assert unmeasured and all(tuple(sorted(s.items())) in tried for s in unmeasured)
    assert len(planned) > 10 * len(tried)       # the modelled knobs' combinations are still there
