"""The planner: legal (family, parameters) candidates, ranked by a cost prior.

For each legal family and dtype the planner forms every parameter
combination the family allows, drops those the target cannot run or the
rules forbid, predicts each one's time on the workload's shapes from
the GPU's plan inputs (measured where `doit probe` measured them, see
plan_inputs.py), and keeps the best few. Validation and timing on the device
decide among the survivors.

The prior is deliberately simple (bytes over bandwidth, scaled by how much of
the machine and of each access the launch uses); it only has to put good
candidates ahead of bad ones.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from . import codegen, plan_inputs
from .dtypes import DTYPES
from .ops import OPERATORS
from .semantics import accuracy
from .semantics.legality import Legality, decide_all
from .semantics.ruleset import Family

# The inputs the plan reads (plan_inputs.resolve gives them from a hwdb entry);
# nothing else of the entry reaches its key.
PLAN_INPUTS = ("sm_count", "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm",
               "registers_per_sm", "dram_bandwidth", "l2_capacity", "cached_sweep_speedup", "launch_seconds",
               "saturating_bytes_per_sm", "uncoalesced_penalty", "block_reduction_seconds",
               "dram_latency_seconds", "l2_latency_seconds", "max_cluster_blocks", "shared_memory_per_sm",
               "shared_memory_per_block_optin")

DATASHEET = "datasheet model"   # the prior of a candidate predicted by the model alone
UNMEASURED_PER_FAMILY = 2       # candidates built besides the measured ones while the lab has not measured them

BASE_REGISTERS = 32             # a family's registers before it holds any of the row
REGISTER_MARGIN = 16            # room for the sweeps' temporaries beside a held row
MAX_THREAD_REGISTERS = 255      # what one thread can address

_WHEN = {
    "wider_than_element": lambda value, dtype: value > dtype.size,
    "true": lambda value, dtype: bool(value),
    "staged": lambda value, dtype: value in codegen.STAGED,
    "prefetched": lambda value, dtype: value in codegen.PREFETCHED,
}


@dataclass(frozen=True)
class Candidate:
    id: str
    op: str
    family: str
    dtype: str
    params: dict
    rules: tuple[str, ...]
    predicted_seconds: tuple[float, ...]   # one per workload shape; infinite where it may not serve it
    prior: str = DATASHEET                 # what predicted them
    longest_row: int | None = None         # the longest row its order keeps rtol on (None: any)

    def serves(self, shape) -> bool:
        return accuracy.keeps(self.longest_row, shape[1])

    @property
    def modelled(self) -> bool:
        """Predicted by the model (alone, or calibrated by measured kin): the lab has not measured it
        (or the profile asked for the datasheet prior), so its prediction is not comparable with
        the lab's calibrated ones."""
        return self.prior.startswith(DATASHEET)

    @property
    def score(self) -> float:
        """Geometric mean of the predicted times: every shape counts alike (infinite where the
        candidate serves only some of them)."""
        return math.exp(sum(math.log(t) for t in self.predicted_seconds) / len(self.predicted_seconds))

    def as_record(self) -> dict:
        return {"id": self.id, "op": self.op, "family": self.family, "dtype": self.dtype,
                "params": self.params, "rules": list(self.rules),
                "predicted_seconds": [t if math.isfinite(t) else None for t in self.predicted_seconds],
                "prior": self.prior, "longest_row": self.longest_row}

    @classmethod
    def from_record(cls, r: dict) -> "Candidate":
        return cls(r["id"], r["op"], r["family"], r["dtype"], dict(r["params"]), tuple(r["rules"]),
                   tuple(math.inf if t is None else t for t in r["predicted_seconds"]), r.get("prior", DATASHEET),
                   r.get("longest_row"))


def candidate_id(family: str, dtype: str, p: dict) -> str:
    fast = ".fastexp" if p["fast_exp"] else ""
    cache = f".c{p['cache_packs']}" if p["cache_packs"] else ""
    return f"{family}.{dtype}.t{p['threads']}.v{p['vec_bytes']}.{p['topology']}{cache}{fast}"


def predict_seconds(family: Family, dtype_name: str, p: dict, shape: tuple[int, int], hw: dict) -> float:
    """The datasheet model: the longer of moving the bytes and a lane's chain of memory waits."""
    return max(model_terms(family, dtype_name, p, shape, hw))


@dataclass(frozen=True)
class Residency:
    """How a realisation lays out rows of one length on an SM."""
    lanes: int            # threads per row
    rows_per_block: float
    vec: int              # elements per access (1 where the row does not allow packs)
    tiny: bool            # a thread holds several tiny rows at their exact length
    staged: bool          # the row lives in shared memory
    fits: bool            # the row is held (registers or shared memory) between sweeps
    blocks_per_sm: int

    @property
    def rows_per_sm(self) -> float:
        return self.blocks_per_sm * self.rows_per_block


def residency(dtype_name: str, p: dict, cols: int, hw: dict) -> Residency:
    dtype = DTYPES[dtype_name]
    threads = p["threads"]
    lanes = codegen.lanes_per_row(p["topology"], threads)
    blocks_per_row = codegen.blocks_per_row(p["topology"])
    rows_at_once = codegen.rows_per_thread(p["topology"])
    rows_per_block = threads // lanes * rows_at_once if blocks_per_row == 1 else 1 / blocks_per_row
    # A thread serving several tiny rows holds each at its exact length, all loaded at once.
    tiny = rows_at_once > 1 and cols <= plan_inputs.TINY_ROW
    vec = (p["vec_bytes"] // dtype.size if cols % max(1, p["vec_bytes"] // dtype.size) == 0 and not tiny
           else 1)
    # Registers: a cached row costs one per element its slots hold (whether or not the row fills
    # them), and caps occupancy.
    held = cols * rows_at_once if tiny else p["cache_packs"] * vec
    # A staged row (whole packs, within the block's shared memory) costs its bytes of shared memory instead.
    row_bytes = cols * dtype.size
    staged = (p["topology"] in codegen.STAGED and vec * dtype.size == p["vec_bytes"]
              and row_bytes <= hw["shared_memory_per_block_optin"])
    fits = tiny or staged or (held > 0 and cols <= lanes * held)
    registers = BASE_REGISTERS + (held if fits and not staged else 0)
    # A prefetching block holds its row and keeps the next one's copy in shared memory.
    in_shared = staged or (p["topology"] in codegen.PREFETCHED and fits and row_bytes <= hw["shared_memory_per_block_optin"])
    blocks_per_sm = max(1, min(hw["max_blocks_per_sm"], hw["max_threads_per_sm"] // threads,
                               hw["registers_per_sm"] // (registers * threads),
                               hw["shared_memory_per_sm"] // row_bytes if in_shared else hw["max_blocks_per_sm"]))
    return Residency(lanes, rows_per_block, vec, tiny, staged, fits, blocks_per_sm)


def model_terms(family: Family, dtype_name: str, p: dict, shape: tuple[int, int], hw: dict) -> tuple[float, float]:
    """(seconds to move the bytes, seconds of the longest chain of waits), launch and
    block reductions included in both."""
    rows, cols = shape
    dtype = DTYPES[dtype_name]
    if p["topology"] == codegen.FLAT:
        # No rows: to the model, a flat walk is rows of one pack per thread of a block, none
        # reduced (dense rows are walked in packs whatever their length).
        chunk = p["threads"] * p["vec_bytes"] // dtype.size
        shape = rows, cols = math.ceil(rows * cols / chunk), chunk
    op = OPERATORS[family.op]
    threads = p["threads"]
    blocks_per_row = codegen.blocks_per_row(p["topology"])
    rows_at_once = codegen.rows_per_thread(p["topology"])
    on_sm = residency(dtype_name, p, cols, hw)
    lanes, vec, fits, rows_per_block = on_sm.lanes, on_sm.vec, on_sm.fits, on_sm.rows_per_block
    blocks = math.ceil(rows / rows_per_block)
    row_bytes = cols * dtype.size
    resident_blocks = min(blocks, hw["sm_count"] * on_sm.blocks_per_sm)
    waves = math.ceil(blocks / (hw["sm_count"] * on_sm.blocks_per_sm))

    # Bytes: the first sweep and the write go to DRAM; later sweeps hit L2
    # when the rows being worked on at once fit in it.
    out_bytes = rows * (cols if op.output == "matrix" else 1) * dtype.size
    vector_bytes = len(op.vectors) * row_bytes + len(op.matrices) * rows * row_bytes
    resident_fits = resident_blocks * rows_per_block * row_bytes <= hw["l2_capacity"]
    extra = (0 if fits else family.sweeps - 1) * rows * row_bytes
    dram_bytes = rows * row_bytes + out_bytes + vector_bytes + (0 if resident_fits else extra)
    cached_bytes = extra if resident_fits else 0

    # Utilisation: lanes left idle at the end of a short row, and too few
    # bytes in flight when the launch does not fill the machine.
    per_step = lanes * vec
    lane_use = cols / (math.ceil(cols / per_step) * per_step)
    # A lane has LOADS_IN_FLIGHT accesses out at once, fewer when its share of the row is smaller;
    # a staged row has all of them out at once.
    accesses = (rows_at_once * cols if on_sm.tiny else math.ceil(cols / per_step) if on_sm.staged
                else min(plan_inputs.LOADS_IN_FLIGHT, math.ceil(cols / per_step)))
    in_flight = resident_blocks * threads * accesses * vec * dtype.size
    fill = min(1.0, in_flight / (hw["sm_count"] * hw["saturating_bytes_per_sm"]))
    # A thread per row: a warp's access touches 32 rows; wider accesses use more of each.
    # Rows no longer than a 32-byte sector lie side by side, so the warp reads whole sectors.
    strided = lanes == 1 and row_bytes > plan_inputs.SECTOR_BYTES
    coalescing = min(1.0, vec * dtype.size / 4 / hw["uncoalesced_penalty"]) if strided else 1.0
    bandwidth = hw["dram_bandwidth"] * fill * lane_use * coalescing

    # The longest path: a lane meets its share of a row in groups of
    # LOADS_IN_FLIGHT accesses, and each group waits for memory once (a lane's
    # accesses within one sector wait once between them; a held row is loaded
    # in one group; later sweeps re-read from L2). A launch of few rows is
    # bound by it, not by bandwidth: one thread walking a row of 65536 waits
    # thousands of times.
    per_wait = max(plan_inputs.LOADS_IN_FLIGHT * vec * dtype.size, plan_inputs.SECTOR_BYTES)
    groups = 1 if fits else math.ceil(row_bytes / lanes / per_wait)
    later = 0 if fits else family.sweeps - 1
    row_seconds = groups * (hw["dram_latency_seconds"] + later * hw["l2_latency_seconds"])

    overhead = hw["launch_seconds"]
    if lanes > 32 and p["topology"] != codegen.FLAT:   # a block's reduction; a cluster's adds one more level like it
        # a prefetching block's reductions overlap its next row's loads: only its last row's show
        reduced_waves = 1 if p["topology"] in codegen.PREFETCHED else waves
        overhead += reduced_waves * hw["block_reduction_seconds"] * (family.sweeps - 1 or 1) * (1 + (blocks_per_row > 1))
    by_bytes = (dram_bytes + cached_bytes / hw["cached_sweep_speedup"]) / bandwidth
    return overhead + by_bytes, overhead + waves * row_seconds


def _combinations(family: Family):
    names = sorted(family.params)
    for values in itertools.product(*(family.params[n] for n in names)):
        yield dict(zip(names, values))


def runnable_params(family: Family, dtype_name: str, hw: dict):
    """Every parameter combination of `family` the target can run in `dtype` (rules aside)."""
    if not family.realises(dtype_name):
        return
    dtype = DTYPES[dtype_name]
    for p in _combinations(family):
        if p["threads"] > hw["max_threads_per_block"] or p["threads"] % 32:
            continue
        if p["vec_bytes"] < dtype.size or p["vec_bytes"] % dtype.size:
            continue
        if codegen.blocks_per_row(p["topology"]) > hw["max_cluster_blocks"]:
            continue
        # A thread serving several rows holds them only while they are tiny, whatever CACHE says.
        if codegen.rows_per_thread(p["topology"]) > 1 and p["cache_packs"]:
            continue
        # A staged row is copied in 16-byte packs and swept from shared memory, not also held in
        # registers: on the H200 holding it as well was slower than the staged row alone
        # (softmax bfloat16 4096x32768: t1024 c4 199 us, t256 unheld 152 us).
        if p["topology"] in codegen.STAGED and (p["vec_bytes"] != 16 or p["cache_packs"]):
            continue
        # A prefetched row is held in registers, its successor copied in 16-byte packs meanwhile.
        if p["topology"] in codegen.PREFETCHED and (p["vec_bytes"] != 16 or not p["cache_packs"]):
            continue
        # A held row and the sweeps' temporaries must fit in one thread's share
        # of the registers at a full block (the kernel's launch bound caps it
        # there); whether the rest fits too is ptxas's call: a kernel that
        # spills is timed by the build, which sees what the spill costs.
        held = p["cache_packs"] * (p["vec_bytes"] // dtype.size)
        share = min(MAX_THREAD_REGISTERS, hw["registers_per_sm"] // p["threads"])
        if held + REGISTER_MARGIN > share:
            continue
        yield p


def structure(c: Candidate, cols: int, hw: dict) -> tuple:
    """What makes two candidates structurally different on rows of `cols`: how a row is split,
    whether it is held, and whether an SM works on one row at a time. The last is where the
    prior is weakest: a held row whose slots the row only half fills costs a whole row's
    registers, so one row per SM is resident, and nothing overlaps its reductions (H200,
    residual + rmsnorm bfloat16 2048x16384: t512 c8 87 us against t512 c4 55 us, the prior
    51 and 53 us)."""
    alone = residency(c.dtype, c.params, cols, hw).rows_per_sm <= 1
    return c.params["topology"], c.params["cache_packs"] > 0, alone


def _best_spread(pool: list[Candidate], count: int, structure_of) -> list[Candidate]:
    """The `count` best by prior: the best overall, the predicted best at each
    workload shape (select dispatches per shape), the best of each structure
    (`structure_of`; the prior is coarse, so the device gets to compare structurally
    different options), then the rest."""
    pool = sorted(pool, key=lambda c: (c.score, c.id))
    if not pool:
        return []
    shape_leaders = [min(serving, key=lambda c: (c.predicted_seconds[i], c.id))
                     for i in range(len(pool[0].predicted_seconds))
                     if (serving := [c for c in pool if math.isfinite(c.predicted_seconds[i])])]
    structure_leaders = sorted({structure_of(c): c for c in reversed(pool)}.values(), key=lambda c: (c.score, c.id))
    by_id = {c.id: c for c in pool[:1] + shape_leaders + structure_leaders + pool}   # first occurrence keeps its place
    return list(by_id.values())[:count]


def plan_op(op: str, legalities: dict[str, Legality], families: list[Family], dtypes, shapes, hw: dict,
            per_family: int, measured=None, bounds: dict | None = None, rejected: list | None = None,
            ruleset=None) -> list[Candidate]:
    """The candidates to build for `op`, best predicted first within each (family, dtype).
    `measured` (a realisation.MeasuredPrior) predicts what it measured; the datasheet model the rest.
    With `bounds` (dtype -> rtol) and the `ruleset`, a realisation serves only the workload shapes
    whose rows its order keeps the bound on (semantics/accuracy.py: its predicted time elsewhere is
    infinite) and is dropped where it serves none, or where its measured drift exceeds the bound
    at the longest row it serves; a rule whose every realisation was dropped is reported in
    `rejected` with the bound or the measurement."""
    chosen: list[Candidate] = []
    max_cols = max(cols for _, cols in shapes)
    structure_of = functools.partial(structure, cols=max_cols, hw=hw)   # the longest rows: where residency bites
    dropped: dict[tuple[str, str], list] = {}   # (dtype, rule) -> [what dropped a realisation using it]
    kept: dict[str, set] = {}                   # dtype -> rules some kept candidate uses
    for family in families:
        for dtype_name in dtypes:
            legality = legalities[dtype_name]
            if not family.realises(dtype_name) or not legality.families[family.name].legal:
                continue
            dtype = DTYPES[dtype_name]
            pool = []
            bound = (bounds or {}).get(dtype_name) or 0.0   # rtol 0: exactness is checked bit for bit instead
            for p in runnable_params(family, dtype_name, hw):
                extra = [pr.rule for pr in family.param_rules if _WHEN[pr.when](p[pr.param], dtype)]
                if not all(legality.rules[r].legal for r in extra):
                    continue
                rules = tuple(dict.fromkeys(family.rules + tuple(extra)))
                # a staged row gives the bits of its unstaged twin, so the twin's measured drift is its own
                same_bits = dict(p, topology=codegen.UNSTAGED.get(p["topology"], p["topology"]))
                longest = accuracy.longest_row(ruleset, op, dtype_name, p, bound) if ruleset else None
                served = accuracy.served(shapes, longest)
                serves = set(served)   # looked up once per shape below: a tuple's scan made that quadratic
                why = None
                if not served:
                    why = _too_long(longest, min(c for _, c in shapes), family.name, dtype_name, bound, ruleset)
                elif measured and bound > 0:
                    drift = measured.drift(candidate_id(family.name, dtype_name, same_bits), max(c for _, c in served))
                    if drift and drift[0] > bound:
                        why = _drifted(drift, family.name, dtype_name, bound, measured)
                if why:
                    for rule in rules:
                        dropped.setdefault((dtype_name, rule), []).append(why)
                    continue
                times, prior = _predict(family, dtype_name, p, shapes, hw, measured)
                # a shape it may not serve: never its shape to lead, nor a time to rank it by
                times = tuple(t if s in serves else math.inf for t, s in zip(times, shapes))
                pool.append(Candidate(candidate_id(family.name, dtype_name, p), op, family.name,
                                      dtype_name, p, rules, times, prior, longest))
            kept.setdefault(dtype_name, set()).update(r for c in pool for r in c.rules)
            calibrated = [c for c in pool if not c.modelled]
            if measured is not None and calibrated:
                # The model alone is not comparable with predictions the lab calibrated (it counts
                # no arithmetic: staged rows looked 1.3x faster than measured). Realisations the lab
                # has not measured yet compete among themselves, and their best few are built
                # besides the measured ones, for the device to compare.
                chosen.extend(_best_spread(calibrated, per_family, structure_of))
                chosen.extend(_best_spread(_could_lead([c for c in pool if c.modelled], calibrated),
                                           min(per_family, UNMEASURED_PER_FAMILY), structure_of))
            else:
                chosen.extend(_best_spread(pool, per_family, structure_of))
    for (dtype_name, rule), whys in sorted(dropped.items()):
        if rejected is not None and rule not in kept.get(dtype_name, set()):
            rejected.append({"rule": rule, **min(whys, key=_closest)})
    return chosen


def _could_lead(unmeasured: list[Candidate], measured: list[Candidate]) -> list[Candidate]:
    """The unmeasured candidates predicted faster than every measured one at some workload shape:
    one predicted slower everywhere would not be chosen if its prediction held, and a profile
    the lab measured in part (a budget) leaves many such (they were measured last for that)."""
    best = [min(c.predicted_seconds[i] for c in measured) for i in range(len(measured[0].predicted_seconds))]
    return [c for c in unmeasured if any(t < b for t, b in zip(c.predicted_seconds, best))]


def _drifted(drift: tuple, family: str, dtype: str, bound: float, measured) -> dict:
    return {"by": "measured drift", "family": family, "dtype": dtype, "drift": drift[0], "cols": drift[1],
            "bound": bound, "source": measured.profile.source()}


def _too_long(longest: int, cols: int, family: str, dtype: str, bound: float, ruleset) -> dict:
    return {"by": "rounding bound", "family": family, "dtype": dtype, "longest_row": longest, "cols": cols,
            "bound": bound, "source": ruleset.rounding.ref}


def _closest(why: dict) -> tuple:
    """What came nearest to keeping a realisation: the least drift, else the longest row kept."""
    return (why["by"] != "measured drift", why.get("drift", 0.0), -why.get("longest_row", 0), why["family"])


def _predict(family: Family, dtype_name: str, p: dict, shapes, hw: dict, measured) -> tuple[tuple, str]:
    if measured is not None:
        times = [measured(family, dtype_name, p, s) for s in shapes]
        if None not in times:
            name, timed_as = measured.measured_as(family, dtype_name, p)
            note = ("" if (name, timed_as) == (family.name, dtype_name)
                    else f" ({dtype_name} timed as {timed_as}: the same element size)" if name == family.name
                    else f" (timed as {candidate_id(name, timed_as, p)}: {family.name} is declared timed like it)")
            return tuple(times), measured.profile.source() + note
        borrowed = [measured.borrowed(family, dtype_name, p, s) for s in shapes]
        if None not in borrowed:   # not measured itself: the model, calibrated by its measured kin
            return tuple(borrowed), f"{DATASHEET} calibrated by {measured.borrowed_source(family, dtype_name, p)}"
    return tuple(predict_seconds(family, dtype_name, p, s, hw) for s in shapes), DATASHEET


def plan_workload(ruleset, prof, hw: dict, per_family: int | None = None, measured=None,
                  rejected: dict | None = None) -> dict:
    """op -> ({dtype: Legality}, [Candidate]) for every operator of a profile's workload;
    `rejected` (if given) gets op -> the rules measured drift or the rounding bound rejected."""
    planned = {}
    bounds = {dtype: rtol for dtype, (rtol, _atol) in prof.preservation.tolerance.items()}
    for op, work in prof.workload.items():
        decided = decide_all(op, work.dtypes, ruleset, prof.preservation, prof.choice)
        found = [] if rejected is None else rejected.setdefault(op, [])
        planned[op] = (decided, plan_op(op, decided, ruleset.families_of(op), work.dtypes, work.shapes, hw,
                                        per_family or prof.candidates_per_family, measured, bounds, found, ruleset))
    return planned
