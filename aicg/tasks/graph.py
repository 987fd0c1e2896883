"""The step graph of one compiler instance.

hw -> legality:<op> -> plan:<op> -> codegen:<cand> -> compile:<cand>
   -> validate:<cand> -> select:<op> -> package
(and synth:<op>.<dtype>.<round> -> select:<op> when the profile asks for synthesis)

Deciding which candidates exist is cheap (TOML, the legality engine and the
cost prior, all in memory), so it happens when the graph is loaded; the
steps then publish those decisions and do the costly work (compile,
validate) under their keys. Each step reads only the values it needs: the
plan of softmax holds seven hwdb facts, not the whole entry, so a re-probe of
tensor-core throughput leaves it untouched.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .. import codegen, config, digest, hw, nvrtc, occupancy, plan, record, toolchain
from .. import planning as planning_inputs
from .. import validate
from ..errors import CompileError, InputChanged, InputError
from ..matrix import semantics as matrix_semantics
from ..matrix import steps as matrix_steps
from ..primitives import realisation
from ..profile import Profile
from ..store import LayeredStore
from ..semantics import accuracy
from ..semantics import legality as legality_engine
from ..semantics import ruleset as ruleset_loader
from .step import Env, Result, Step
from . import package as packaging


def to_json(value) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class Layout:
    """Where an instance's inputs live (a project checkout, or a copy of one)."""
    root: Path

    @property
    def rules(self) -> Path: return self.root / "rulesets"
    @property
    def hwdb(self) -> Path: return self.root / "hwdb"
    @property
    def kernels(self) -> Path: return self.root / "kernels"


VALIDATION_PROTOCOL = 4


@dataclass
class Instance:
    ruleset: ruleset_loader.RuleSet   # with the matrix family's rules and families where the profile has matmul
    layout: Layout
    profile: Profile
    hardware: hw.Hardware
    steps: list[Step]
    env: Env
    plan_inputs: dict   # name -> plan_inputs.PlanInput: what the plans read, and where it came from
    rejected: dict  # op -> rules rejected by measured drift or the rounding bound, with the reason
    matrix: matrix_steps.MatrixBuild | None = None   # the [[matmul]] classes, decided and planned

    def dtypes_of(self, op: str) -> tuple[str, ...]:
        """The dtypes the profile asks of `op` (none where it does not name it)."""
        if op in self.profile.workload:
            return tuple(self.profile.workload[op].dtypes)
        if op == matrix_semantics.OP and self.matrix:
            return self.matrix.dtypes()
        return ()

    def plan_inputs_of(self, op: str) -> dict:
        """What the plans of `op` read, and where each came from."""
        if op == matrix_semantics.OP and self.matrix:
            return self.matrix.inputs
        return self.plan_inputs

    @property
    def name(self) -> str:
        return self.profile.name


def _hw_step(hardware: hw.Hardware) -> Step:
    record = hardware.as_record()
    out = f"hw/{hardware.target}.json"
    return Step(f"hw:{hardware.target}", f"resolve the hwdb entry of {hardware.name}", record,
                lambda ctx: Result({out: to_json(record)}), ("hw.py", "tasks/graph.py"), targets=(out,))


def _legality_step(op: str, rules, prof, decided: dict) -> Step:
    """decided: dtype -> Legality. The step fails, with the reasons, when the
    profile asks for something its own rules make impossible."""
    fams = rules.families_of(op)
    used = sorted({r for f in fams for r in f.rules} | {p.rule for f in fams for p in f.param_rules})
    dtypes = list(prof.workload[op].dtypes)
    reads = {"op": rules.ops[op].as_record(rules),
             "rules": {r: rules.rules[r].as_record() for r in used},
             "families": {f.name: f.as_record() for f in fams},
             "preservation": prof.preservation.as_record(), "dtypes": dtypes,
             "forbid": sorted(prof.choice.forbid),
             "select": sorted(prof.choice.select) if prof.choice.select is not None else None}
    out = f"legality/{op}.json"

    def run(ctx) -> Result:
        for conflict in legality_engine.selection_conflicts(rules, prof.preservation, prof.choice, dtypes):
            raise InputError(prof.path, "rules.select", f"rules that the preservation level allows; {conflict}")
        for dtype, legality in decided.items():
            if legality.hint:
                raise InputError(prof.path, "workload",
                                 f"operators and dtypes that have a legal family; {legality.hint}")
        return Result({out: to_json({d: l.as_record() for d, l in decided.items()})})

    return Step(f"legality:{op}", f"decide which rules and families {op} may use, and why", reads, run,
                ("semantics/legality.py", "semantics/ruleset.py", "tasks/graph.py"), targets=(out,))


def _plan_step(op: str, rules, work, inputs, prof, candidates, realised, rejected) -> Step:
    reads = {"hw": {name: inputs[name].as_record() for name in plan.PLAN_INPUTS},
             "realisation_profile": realised.digest if realised else None,
             "tolerance": {d: list(prof.preservation.tolerance[d]) for d in work.dtypes}, "families": {f.name: f.as_record() for f in rules.families_of(op)},
             "dtypes": list(work.dtypes), "shapes": [list(s) for s in work.shapes],
             "candidates_per_family": prof.candidates_per_family, "rounding": rules.rounding.as_record(),
             "reductions": rules.ops[op].as_record(rules)["reductions"]}
    out = f"plan/{op}.json"
    record = {"op": op, "shapes": [list(s) for s in work.shapes], "candidates": [c.as_record() for c in candidates],
              "rejected": rejected}
    return Step(f"plan:{op}", f"enumerate and rank the legal candidates of {op}", reads,
                lambda ctx: Result({out: to_json(record)}),
                ("plan.py", "plan_inputs.py", "primitives/realisation.py", "dtypes.py", "ops.py", "semantics/accuracy.py",
                 "tasks/graph.py"), upstream=(f"legality:{op}",), targets=(out,))


def _codegen_step(cand: plan.Candidate, family) -> Step:
    reads = {"id": cand.id, "family": family.as_record(), "dtype": cand.dtype, "params": cand.params}
    out = f"src/{cand.id}.cu"
    return Step(f"codegen:{cand.id}", f"instantiate {family.name} for {cand.dtype}", reads,
                lambda ctx: Result({out: codegen.source(cand.id, family, cand.dtype, cand.params).encode()}),
                ("codegen.py", "ops.py", "dtypes.py"), targets=(out,))


def _compile_step(cand: plan.Candidate, family, hardware: hw.Hardware, layout: Layout) -> Step:
    headers = nvrtc.include_closure(family.header, layout.kernels)
    header_digests = {name: digest.of_bytes(data) for name, data in headers.items()}
    src, cubin, report = f"src/{cand.id}.cu", f"cubin/{cand.id}.cubin", f"cubin/{cand.id}.json"
    arch, registers_per_sm = hardware.arch, hardware.fact("registers_per_sm")
    reads = {"arch": arch, "toolchain": toolchain.identity(), "options": list(nvrtc.OPTIONS),
             "headers": header_digests, "source_name": src, "occupancy": occupancy.POLICY,
             "registers_per_sm": registers_per_sm, "params": cand.params}

    def run(ctx) -> Result:
        source = ctx.upstream(f"codegen:{cand.id}", src).decode()
        now = nvrtc.include_closure(family.header, layout.kernels)
        if now != headers:
            raise InputChanged(f"a header of {family.header} changed while the build ran")
        try:
            binary, resources, log = occupancy.compile_candidate(source, src, now, arch, cand.params, registers_per_sm)
        except CompileError as err:
            raise CompileError(f"{err}\n(generated source: {ctx.env.instance_dir / src})") from None
        return Result({cubin: binary, report: to_json({"resources": resources, "ptxas": log, "arch": arch})})

    def ahead() -> tuple[dict, list[tuple]]:
        source = codegen.source(cand.id, family, cand.dtype, cand.params)
        return ({f"codegen:{cand.id}": {src: digest.of_bytes(source.encode())}},
                [(source, src, headers, arch)])

    return Step(f"compile:{cand.id}", f"NVRTC-compile {cand.id} for {arch}", reads, run,
                ("nvrtc.py", "occupancy.py", "codegen.py"),
                upstream=(f"codegen:{cand.id}",), targets=(cubin, report), ahead=ahead)


VALIDATE_CODE = ("validate/__init__.py", "validate/check.py", "validate/isolated.py", "runtime/driver.py", "ops.py",
                 "dtypes.py", "codegen.py")


def _validation(prof, hardware: hw.Hardware, op: str, dtype: str, timed_shapes, longest_row: int | None = None):
    """(what a validation reads, a function cubin, params[, longest row] -> outcome) for one operator
    and dtype: on rows of at most the longest row (None: every check shape), timed at the workload
    shapes it serves."""
    def settings_for(longest):
        return validate.settings(prof, dtype, accuracy.served(timed_shapes, longest), longest_row=longest)

    reads = {"protocol": VALIDATION_PROTOCOL, "hardware": hardware.identity(),
             "peak_bytes_per_second": hardware.fact("dram_bandwidth"), "op": op, "dtype": dtype,
             **settings_for(longest_row)}
    return reads, lambda cubin, params, longest=longest_row: validate.validate_on_device(
        cubin, hardware, op, dtype, params, **settings_for(longest))


def _validate_step(cand: plan.Candidate, hardware: hw.Hardware, prof, timed_shapes) -> Step:
    reads, check = _validation(prof, hardware, cand.op, cand.dtype, timed_shapes, cand.longest_row)
    cubin, out = f"cubin/{cand.id}.cubin", f"validation/{cand.id}.json"

    def run(ctx) -> Result:
        # A kernel that spills is checked and timed like any other: ptxas spills at
        # the register cap in paths a workload may never take (a row the kernel
        # streams instead of holding), and the timing says what the spill costs.
        outcome = check(ctx.upstream(f"compile:{cand.id}", cubin), cand.params)
        return Result({out: to_json(outcome)}, cache=outcome["status"] != "unvalidated")

    return Step(f"validate:{cand.id}", f"check {cand.id} against float64 on {hardware.name}, and time it",
                {**reads, "params": cand.params}, run, VALIDATE_CODE,
                upstream=(f"compile:{cand.id}",), targets=(out,), local_state=validate.local_device_state,
                role="evidence")


def _synthesis_steps(op: str, dtype: str, rules, prof, hardware, layout, work, hw_facts, decided) -> list[Step]:
    from ..synth import loop
    from ..synth.llm import LLMProposer, LLMSettings
    from ..synth.proposal import SKELETON_HEADERS
    from ..synth.template import TemplateProposer
    # what serves every workload shape: a proposal is timed, and chosen, as the operator's kernel
    rtol = {dtype: prof.preservation.tolerance[dtype][0]}
    pool = [c for c in plan.plan_op(op, {dtype: decided[dtype]}, rules.families_of(op), (dtype,), work.shapes,
                                    hw_facts, 10**6, bounds=rtol, ruleset=rules)
            if all(c.serves(s) for s in work.shapes)]
    families_rules = {f.name: f.rules for f in rules.families_of(op)}
    allowed = {r: rules.rules[r].summary for r in loop.legal_rules(rules, prof, op, dtype)}
    synthesis = prof.synthesis

    def make_proposers(env):
        made = {"template": lambda: TemplateProposer(pool, families_rules),
                "llm": lambda: LLMProposer(LLMSettings(**synthesis.llm), env.store, rules.ops[op].form, allowed)}
        return [made[name]() for name in synthesis.proposers]

    val_reads, check = _validation(prof, hardware, op, dtype, work.shapes)
    llm = {k: v for k, v in (synthesis.llm or {}).items() if k not in ("base_url", "api_key_env", "timeout")}
    headers = {}
    for header in {f.header for f in rules.families_of(op)} | set(SKELETON_HEADERS):
        headers.update(nvrtc.include_closure(header, layout.kernels))
    reads = {"op": rules.ops[op].as_record(rules), "legality": decided[dtype].as_record(),
             "allowed": allowed, "proposers": list(synthesis.proposers), "llm": llm,
             "pool": [c.as_record() for c in pool], "validation": val_reads, "arch": hardware.arch,
             "toolchain": toolchain.identity(), "headers": {n: digest.of_bytes(d) for n, d in sorted(headers.items())}}
    code = ("synth/loop.py", "synth/proposal.py", "synth/template.py", "synth/llm.py", "nvrtc.py", "codegen.py",
            *VALIDATE_CODE)
    steps = loop.round_steps(op, dtype, prof, rules, hardware, layout, make_proposers, check, pool, code, reads)
    return [dataclasses.replace(s, local_state=validate.local_device_state) for s in steps]


def last_round(op: str, dtype: str, prof) -> str | None:
    return f"synth:{op}.{dtype}.{prof.synthesis.rounds - 1}" if prof.synthesis else None


def _select_step(op: str, work, candidates, prof) -> Step:
    rounds = {d: last_round(op, d, prof) for d in work.dtypes} if prof.synthesis else {}
    upstream = (f"plan:{op}", *(f"validate:{c.id}" for c in candidates), *(f"compile:{c.id}" for c in candidates),
                *rounds.values())
    out = f"select/{op}.json"

    def run(ctx) -> Result:
        results = {c.id: json.loads(ctx.upstream(f"validate:{c.id}", f"validation/{c.id}.json")) for c in candidates}
        reports = {c.id: json.loads(ctx.upstream(f"compile:{c.id}", f"cubin/{c.id}.json")) for c in candidates}
        trajectories = {d: json.loads(ctx.upstream(step, f"synth/{op}.{d}.{prof.synthesis.rounds - 1}.json"))
                        for d, step in rounds.items()}
        untrusted = {c.id for c in candidates if not ctx.trusted(f"validate:{c.id}")}
        untrusted |= {f"synth:{op}.{d}" for d, step in rounds.items() if not ctx.trusted(step)}
        return Result({out: to_json(packaging.select(op, work.dtypes, candidates, results, reports, trajectories,
                                                     untrusted))})

    return Step(f"select:{op}", f"choose the fastest valid candidate of {op} per dtype", {"op": op, "dtypes": list(work.dtypes)},
                run, ("tasks/package.py",), upstream=upstream, targets=(out,), role="verdict")


def planning_snapshot(layout: Layout, profile_path: Path, prof, matrix=None) -> dict[str, bytes]:
    """What an instance carries to plan and compile a shape it was not tuned for (aicg/runtime/jit.py,
    aicg/matrix/jit.py): path inside the instance -> bytes."""
    files = {"source/profile.toml": Path(profile_path).read_bytes()}
    files.update({f"source/rulesets/{name}": (layout.rules / name).read_bytes() for name in ruleset_loader.FILES})
    if prof.matmul:   # only then: an instance without matrix multiplies carries what it always carried
        files[f"source/rulesets/{matrix_semantics.FILE}"] = (layout.rules / matrix_semantics.FILE).read_bytes()
        files.update({f"source/kernels/matrix/{h.name}": h.read_bytes()
                      for h in sorted((layout.kernels / "matrix").glob("*.cuh"))})
        found = matrix.measured if matrix is not None else None
        if found is not None:   # the matrix profile the plan was calibrated with (another GPU's, with its entry)
            files[f"source/hwdb/{found.profile.path.name}"] = found.profile.path.read_bytes()
            if found.borrowed:
                kin = layout.hwdb / f"{found.measured_on.target}.toml"
                files[f"source/hwdb/{kin.name}"] = kin.read_bytes()
    for path in (layout.hwdb / f"{prof.target}.toml", realisation.path_for(layout.hwdb, prof.target)):
        if path.exists():
            files[f"source/hwdb/{path.name}"] = path.read_bytes()
    files.update({f"source/kernels/{h.name}": h.read_bytes() for h in sorted(layout.kernels.glob("*.cuh"))})
    return files


def load_instance(layout: Layout, profile_path: Path, build_dir: Path, store_config=None, recache=False,
                  target: str | None = None) -> Instance:
    """The instance of the profile at `profile_path`, for its own target or for `target` (as
    `doit build target=` gives it: an hwdb entry, or "auto" for this machine's GPU; aicg/target.py)."""
    from .. import target as targets
    planning = planning_inputs.load(layout.rules, profile_path, layout.hwdb, target)
    rules, prof, hardware, inputs, hw_facts = (planning.rules, planning.prof, planning.hardware, planning.inputs,
                                               planning.hw_facts)
    realised, measured = planning.realised, planning.measured
    store_config = store_config or config.load(layout.root, prof.cache, recache)
    env = Env(Path(build_dir) / prof.name, LayeredStore(store_config))
    env.store.attach_record(record.path_for(layout.hwdb, hardware.target))

    steps = [_hw_step(hardware)]
    rejected: dict = {}
    planned = plan.plan_workload(rules, prof, hw_facts, measured=measured, rejected=rejected)
    for op, work in prof.workload.items():
        decided, candidates = planned[op]
        steps += [_legality_step(op, rules, prof, decided), _plan_step(op, rules, work, inputs, prof, candidates, realised,
                                                                         rejected[op])]
        for cand in candidates:
            family = rules.families[cand.family]
            steps += [_codegen_step(cand, family), _compile_step(cand, family, hardware, layout),
                      _validate_step(cand, hardware, prof, work.shapes)]
        if prof.synthesis:
            for dtype in work.dtypes:
                if decided[dtype].legal_families():
                    steps += _synthesis_steps(op, dtype, rules, prof, hardware, layout, work, hw_facts, decided)
        steps.append(_select_step(op, work, candidates, prof))
    matrix = matrix_steps.load(layout.rules, rules, prof, hardware, layout.hwdb) if prof.matmul else None
    if matrix:
        steps += matrix_steps.steps(matrix, prof, hardware, layout.kernels)
    snapshot = planning_snapshot(layout, profile_path, prof, matrix)
    # built for another target, the JIT must plan for that one: its profile says so
    snapshot["source/profile.toml"] = targets.snapshot_profile(profile_path, prof)
    steps.append(packaging.package_step(prof, hardware, planned, rules, snapshot, matrix))
    # `doit explain op=matmul` decides the matrix families with the same engine, from the merged rule sets
    # an instance of matrix multiplies alone: its plans read the matrix prior's inputs
    shown_inputs = dict(matrix.inputs) if matrix and not prof.workload else inputs
    return Instance(matrix.ruleset if matrix else rules, layout, prof, hardware, steps, env, shown_inputs, rejected,
                    matrix)
