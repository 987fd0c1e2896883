"""What ptxas made of named candidates, read from their SASS on a machine with no GPU: the path a
row held in registers runs, its instructions per element between the row's reductions, and the
share of an SM's issue slots they take at the copy's bandwidth. A static look at a kernel change
before the device times it; it measures nothing.

    python tests/bench/sass.py [--kernels DIR]... [--dump] [--target ENTRY] CANDIDATE_ID...

A candidate id is the planner's (as tests/bench/check_candidates.py takes it); the kernel is built
as a build builds it (aicg/occupancy.py: two blocks asked for where that pays). --kernels takes the
headers from another directory (an earlier commit's kernels/, say); given more than once, each
candidate is built with each. --dump prints the whole disassembly. nvdisasm comes from
$AICG_NVDISASM, the PATH, or the nvidia-cuda-nvdisasm wheel (the `test` extra installs it).
--target names the hwdb entry built for and whose measured copy bandwidth and clock the share is
taken at (default: this machine's GPU's entry where it has one, else the default profile's target).

The held path is found by its shape: the slots' loads, one a slot (predicated where slots are
tested), then no branch back before the path's unconditional EXIT. Its instructions are split at
the end of each block reduction (its second barrier) and counted without branches, reconvergence
marks and exits (control, a few a slot, not the work). Every slot is taken to be held: the
instructions a lane issues on a row of lanes x slots x pack elements.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aicg import hw  # noqa: E402, F401 (tests load entries through this module)
from aicg import target as targets  # noqa: E402
from aicg.dtypes import DTYPES  # noqa: E402
from aicg.ops import OPERATORS  # noqa: E402
from aicg.semantics import ruleset  # noqa: E402
from aicg.validate.check import moved_bytes  # noqa: E402
from check_candidates import build, hardware_for, params_of  # noqa: E402

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:(@!?U?P[T0-9]+)\s+)?([A-Z0-9_.]+)\s*(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
# Branches and reconvergence marks: counted apart from the work they steer.
CONTROL = {"BRA", "BSSY", "BSYNC", "WARPSYNC", "NOP", "EXIT", "RET"}
# A global load of a held slot, by the pack's bytes (read-only loads add .CONSTANT).
SLOT_LOAD = {16: "LDG.E.128", 8: "LDG.E.64", 4: "LDG.E", 2: "LDG.E.U16"}


def loads_a_slot(opcode: str, pack_bytes: int) -> bool:
    return opcode.removesuffix(".CONSTANT") == SLOT_LOAD[pack_bytes]


@dataclass(frozen=True)
class Instruction:
    address: int
    guard: str      # the predicate it runs under ("@P0", "@!P6"), "" for none
    opcode: str
    operands: str


def nvdisasm() -> str:
    """The nvdisasm to run: $AICG_NVDISASM, the PATH's, or the nvidia-cuda-nvdisasm wheel's."""
    found = os.environ.get("AICG_NVDISASM") or shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for folder in (spec.submodule_search_locations if spec else []):
        for candidate in sorted(Path(folder).glob("cu*/bin/nvdisasm")):
            return str(candidate)
    raise SystemExit("nvdisasm not found: pip install nvidia-cuda-nvdisasm (the `test` extra), "
                     "or set AICG_NVDISASM to its path")


def disassemble(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout


def parse(sass: str) -> tuple[list[Instruction], dict[str, int]]:
    """The instructions in order, and each label's index into them."""
    instructions, labels = [], {}
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        m = _INSTRUCTION.match(line)
        if m:
            instructions.append(Instruction(int(m.group(1), 16), m.group(2) or "", m.group(3), m.group(4)))
    return instructions, labels


@dataclass(frozen=True)
class HeldPath:
    start: int      # index of its first slot load
    end: int        # index of its unconditional EXIT
    tested: bool    # slots tested one by one (predicated loads), or a full row's untested path


def held_paths(instructions: list[Instruction], labels: dict[str, int], slots: int, pack_bytes: int) -> list[HeldPath]:
    """Each stretch of straight-line code (no branch back) from a slot load to an unconditional EXIT
    that loads at least `slots` packs of `pack_bytes`: the paths of a row held in registers."""
    found, i = [], 0
    while i < len(instructions):
        if not loads_a_slot(instructions[i].opcode, pack_bytes):
            i += 1
            continue
        count, tested, j = 0, False, i
        while j < len(instructions):
            ins = instructions[j]
            if loads_a_slot(ins.opcode, pack_bytes):
                count += 1
                tested |= bool(ins.guard)
            target = _TARGET.search(ins.operands)
            if ins.opcode == "BRA" and target and labels.get(target.group(1), len(instructions)) <= j:
                break   # a loop: a streamed row's sweep
            if ins.opcode == "EXIT" and not ins.guard:
                if count >= slots:
                    found.append(HeldPath(i, j, tested))
                break
            j += 1
        i = j + 1
    return found


def segments(instructions: list[Instruction], path: HeldPath) -> list[Counter]:
    """The path's instructions counted by opcode, a Counter for each stretch that ends a block
    reduction (at its second barrier) and one for the rest."""
    parts, current, barriers = [], Counter(), 0
    for ins in instructions[path.start:path.end + 1]:
        if ins.opcode.startswith("BAR"):
            barriers += 1
            current["BAR"] += 1
            if barriers % 2 == 0:
                parts.append(current)
                current = Counter()
            continue
        if ins.opcode.split(".")[0] not in CONTROL:
            current[ins.opcode] += 1
    parts.append(current)
    return parts


def issued(part: Counter) -> int:
    return sum(n for opcode, n in part.items() if opcode != "BAR")


def of_kind(part: Counter, prefix: str) -> int:
    return sum(n for opcode, n in part.items() if opcode.startswith(prefix))


def issue_share(per_element: float, op: str, dtype: str, hardware) -> float:
    """The share of an SM's issue slots that `per_element` instructions a lane take when the SM
    moves its part of the copy's bandwidth. Each scheduler issues one warp instruction a cycle, as
    many lanes as the SM has FP32 lanes (128 on Hopper): derived from the FP32 rate and the clock."""
    rows, cols = 1 << 16, 1 << 12
    elements_per_second = hardware.fact("driver_copy_bandwidth") / (
        moved_bytes(OPERATORS[op], DTYPES[dtype], rows, cols) / (rows * cols))
    clock = hardware.fact("sm_clock_under_load") * 1e6
    lanes = hardware.fact("fp32_flops") / (2 * hardware.fact("sm_count") * hardware.fact("boost_clock") * 1e6)
    return elements_per_second / hardware.fact("sm_count") / clock * per_element / lanes


@dataclass(frozen=True)
class Census:
    path: HeldPath
    elements: int           # a lane's, on a row that fills every slot
    parts: list[Counter]    # segments(): to each reduction's end, then the write

    @property
    def instructions(self) -> int:
        return sum(issued(p) for p in self.parts)

    @property
    def per_element(self) -> float:
        return self.instructions / self.elements


def census(candidate: str, instructions: list[Instruction], labels: dict[str, int]) -> list[Census]:
    """Every held path of the candidate's parsed SASS, counted; none for a family that holds no row."""
    _, dtype, params = params_of(candidate)
    slots, size = params["cache_packs"], DTYPES[dtype].size
    if not slots:
        return []
    pack_bytes = max(params["vec_bytes"], size)
    return [Census(path, slots * pack_bytes // size, segments(instructions, path))
            for path in held_paths(instructions, labels, slots, pack_bytes)]


def report(candidate: str, kernels: Path, rules, hardware, dump: bool) -> str:
    family_name, dtype, _ = params_of(candidate)
    cubin, compiled = build(candidate, kernels, rules, hardware)
    sass = disassemble(cubin)
    instructions, labels = parse(sass)
    asked = f", {compiled['min_blocks']} blocks asked" if compiled["min_blocks"] else ""
    lines = [f"{candidate} [{kernels}]: {compiled['registers']} registers{asked}, "
             f"{compiled['spill_store_bytes']} B spilled, {len(instructions)} instructions"]
    counted = census(candidate, instructions, labels)
    for c in counted:
        mufu = sum(of_kind(p, "MUFU") for p in c.parts)
        share = issue_share(c.per_element, rules.families[family_name].op, dtype, hardware)
        lines.append(f"  held path ({'slots tested' if c.path.tested else 'full row, no slot tested'}), "
                     f"{c.elements} elements a lane: {c.instructions} instructions, "
                     f"{c.per_element:.1f} an element (MUFU {mufu / c.elements:.2f}), {share:.0%} of the SM's "
                     f"issue at the copy's rate")
        names = [f"to reduction {k + 1}" for k in range(len(c.parts) - 1)] + ["write"]
        lines.append("    " + " | ".join(f"{name}: {issued(p)} ({issued(p) / c.elements:.1f})"
                                         for name, p in zip(names, c.parts)))
    if not counted:
        lines.append("  no held path found (a streamed row, or a loop over rows: block_prefetch)")
    if dump:
        lines.append(sass)
    return "\n".join(lines)


# the measured facts issue_share reads (a datasheet gives neither)
SHARE_FACTS = ("driver_copy_bandwidth", "sm_clock_under_load")


def default_target() -> str:
    """This machine's GPU's entry where it has one (no GPU is needed), else the default profile's target."""
    device = targets.present_device()
    entry = targets.entry_of(ROOT / "hwdb", device) if device is not None else None
    if entry is not None:
        return entry
    return tomllib.loads((ROOT / "rulesets/profiles/default.toml").read_text(encoding="utf-8"))["instance"]["target"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--target")
    parser.add_argument("--kernels", type=Path, action="append")
    parser.add_argument("--dump", action="store_true")
    args = parser.parse_args()
    rules = ruleset.load(ROOT / "rulesets")
    hardware = hardware_for(args.target or default_target())
    unmeasured = [f for f in SHARE_FACTS if f not in hardware.facts]
    if unmeasured:
        raise SystemExit(f"{hardware.target} has no measured {', '.join(unmeasured)} to take the issue share at: "
                         f"`doit probe` on the GPU ({hardware.name}) measures them")
    for candidate in args.candidates:
        for kernels in args.kernels or [ROOT / "kernels"]:
            print(report(candidate, kernels, rules, hardware, args.dump), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
