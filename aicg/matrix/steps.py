"""The matrix family's steps in an instance's build graph.

    legality:matmul -> plan:matmul -> codegen:<cand> -> compile:<cand> -> validate:<cand> -> select:matmul -> package

as the row families' (aicg/tasks/graph.py), each a keyed, cached step that
reads only the values it needs: the legality step the matrix rules and
families and the profile's preservation, the plan the matrix prior's hwdb
inputs and the space, a compile the source, the headers it includes, the arch
and the toolchain, a validation the cubin, the target's identity and the
problems it is checked and timed on. Deciding which candidates exist is
cheap and happens when the graph is loaded; the steps publish those
decisions and do the costly work under their keys.

Compilation targets the GPU's own arch (sm_90a on compute capability 9.0:
wgmma exists only there; aicg/matrix/build.py), and the arch is part of
every compile key. Validation keys hold their own code list
(validate_code): the matrix modules a validation runs and the rules of
the kernel's own template, not the row families' or the other templates'.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import digest, hw, nvrtc, toolchain
from .. import validate as row_validation
from ..errors import CompileError, InputChanged, InputError
from ..plan_inputs import PlanInput
from ..semantics import legality as legality_engine
from ..tasks.step import Result, Step
from . import build, calibration, codegen, prior, semantics, space, validation
from . import plan as matrix_plan
from . import select as matrix_select
from .templates import GpuLimits

OP = semantics.OP
_MATRIX = Path(__file__).resolve().parent
TEMPLATE_CODE = tuple(f"matrix/templates/{p.name}" for p in sorted((_MATRIX / "templates").glob("*.py")))
SPACE_CODE = ("matrix/space.py", "matrix/problem.py", *TEMPLATE_CODE)
LEGALITY_CODE = ("matrix/semantics.py", "matrix/workload.py", "semantics/legality.py", "semantics/ruleset.py",
                 "matrix/steps.py")
PLAN_CODE = ("matrix/plan.py", "matrix/prior.py", "matrix/calibration.py", "matrix/accuracy.py", "matrix/reference.py", "matrix/check.py",
             "plan_inputs.py", *LEGALITY_CODE, *SPACE_CODE)
CODEGEN_CODE = ("matrix/codegen.py", *SPACE_CODE)
COMPILE_CODE = ("nvrtc.py", "matrix/build.py", "matrix/codegen.py")
VALIDATE_CODE = ("matrix/validation.py", "matrix/check.py", "matrix/worker.py", "matrix/reference.py",
                 "matrix/launch.py", "matrix/tensormap.py", "matrix/timing.py", "matrix/build.py",
                 "runtime/driver.py", "validate/isolated.py", "dtypes.py", "matrix/space.py", "matrix/problem.py",
                 "matrix/templates/__init__.py", "matrix/templates/base.py")


def validate_code(template: str) -> tuple[str, ...]:
    """What a validation of `template`'s kernels runs: the common modules and that template's rules
    only, so that an edit of one template leaves the others' validations (and the records of them) valid."""
    return (*VALIDATE_CODE, f"matrix/templates/{template}.py")
SELECT_CODE = ("matrix/select.py", "matrix/steps.py")


def to_json(value) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


def template_record(name: str) -> dict:
    t = space.templates()[name]
    return {"header": t.header, "function": t.function, "compute_capability": list(t.compute_capability),
            "exact": t.exact, "a_layouts": list(t.a_layouts), "b_layouts": list(t.b_layouts),
            "knobs": {k: list(v) for k, v in t.knobs.items()}, "tried": [dict(s) for s in t.tried]}


@dataclass
class MatrixBuild:
    """The profile's matrix classes, decided and planned when the graph loads."""
    semantics: semantics.Semantics
    classes: tuple
    legalities: dict              # class name -> semantics.ClassLegality
    plans: list                   # matrix_plan.ClassPlan, one per class
    inputs: dict[str, PlanInput]  # the prior's inputs, with where each came from
    limits: GpuLimits
    arch: str
    measured: calibration.Found | None = None   # the matrix profile calibrating the prior, and its GPU
    calibration: calibration.Calibration | None = None   # the prior's calibration by that profile

    @property
    def ruleset(self):
        return self.semantics.ruleset

    @property
    def candidates(self) -> list[matrix_plan.Candidate]:
        return [c for p in self.plans for c in p.candidates]

    def dtypes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.dtype for c in self.classes))


def load(rules_dir: Path, base_rules, prof, hardware: hw.Hardware, hwdb_dir: Path) -> MatrixBuild:
    sem = semantics.load(rules_dir, base_rules)
    inputs = prior.inputs(hardware)
    values = prior.values(inputs)
    limits = GpuLimits.of_hardware(hardware)
    calibrated, found = calibration.of_target(hwdb_dir, hardware)
    legalities, plans = {}, []
    for cls in prof.matmul:
        decided = semantics.decide(sem, cls.dtype, cls.epilogue, prof.preservation, prof.choice)
        legalities[cls.name] = decided
        plans.append(matrix_plan.plan_class(cls, sem, decided, values, limits,
                                            prof.preservation.tolerance[cls.dtype][0], prof.candidates_per_family,
                                            calibrated))
    arch = build.RULES["mma"].arch(tuple(hardware.compute_capability))
    return MatrixBuild(sem, tuple(prof.matmul), legalities, plans, inputs, limits, arch, found, calibrated)


def _legality_step(m: MatrixBuild, prof) -> Step:
    reads = {**m.semantics.record(), "preservation": prof.preservation.as_record(),
             "classes": [c.as_record() for c in m.classes], "forbid": sorted(prof.choice.forbid),
             "select": sorted(prof.choice.select) if prof.choice.select is not None else None}
    out = f"legality/{OP}.json"

    def run(ctx) -> Result:
        dtypes = m.dtypes()
        for conflict in legality_engine.selection_conflicts(m.ruleset, prof.preservation, prof.choice, dtypes):
            raise InputError(prof.path, "rules.select", f"rules that the preservation level allows; {conflict}")
        for cls in m.classes:
            decided = m.legalities[cls.name]
            if not decided.usable:
                why = decided.legality.hint or "; ".join(f"{f}: {w}" for f, w in sorted(decided.blocked.items()))
                raise InputError(prof.path, cls.where, f"a dtype and epilogue some matrix family may compute under "
                                                       f"the profile's preservation; {cls.name}: {why}")
        return Result({out: to_json({name: {"legality": d.legality.as_record(), "usable": list(d.usable),
                                            "blocked": d.blocked} for name, d in m.legalities.items()})})

    return Step(f"legality:{OP}", "decide which matrix families and rules each matmul class may use, and why",
                reads, run, LEGALITY_CODE, targets=(out,))


def _plan_step(m: MatrixBuild, prof) -> Step:
    templates = sorted({f.template for f in m.semantics.families.values()})
    reads = {"inputs": {name: i.as_record() for name, i in m.inputs.items()}, "limits": vars(m.limits),
             "space": {t: template_record(t) for t in templates}, "classes": [c.as_record() for c in m.classes],
             "tolerance": {c.dtype: list(prof.preservation.tolerance[c.dtype]) for c in m.classes},
             "per_family": prof.candidates_per_family,
             "matrix_profile": None if m.measured is None else {
                 "digest": m.measured.profile.digest, "measured_on": m.measured.measured_on.target,
                 "inputs": {n: i.as_record() for n, i in prior.inputs(m.measured.measured_on).items()}}}
    record = {"op": OP, "classes": [p.as_record() for p in m.plans],
              "inputs": {name: i.as_record() for name, i in m.inputs.items()},
              "calibration": m.measured.source(prof.target) if m.measured else
              "none: the model alone (no matrix profile)"}
    out = f"plan/{OP}.json"
    return Step(f"plan:{OP}", "enumerate the legal matrix realisations of each class and rank them by the prior",
                reads, lambda ctx: Result({out: to_json(record)}), PLAN_CODE, upstream=(f"legality:{OP}",),
                targets=(out,))


def _codegen_step(cand: matrix_plan.Candidate) -> Step:
    reads = {"id": cand.id, "realisation": cand.real.as_dict(), "template": template_record(cand.template)}
    out = f"src/{cand.id}.cu"
    return Step(f"codegen:{cand.id}", f"instantiate the {cand.template} template for {cand.real.name}", reads,
                lambda ctx: Result({out: codegen.source(cand.real).encode()}), CODEGEN_CODE, targets=(out,))


def _compile_step(cand: matrix_plan.Candidate, arch: str, kernels_dir: Path) -> Step:
    header = space.templates()[cand.template].header
    headers = nvrtc.include_closure(header, kernels_dir)
    src, cubin, report = f"src/{cand.id}.cu", f"cubin/{cand.id}.cubin", f"cubin/{cand.id}.json"
    reads = {"arch": arch, "toolchain": toolchain.identity(), "options": list(nvrtc.OPTIONS),
             "headers": {name: digest.of_bytes(data) for name, data in headers.items()}, "source_name": src}

    def run(ctx) -> Result:
        source = ctx.upstream(f"codegen:{cand.id}", src).decode()
        now = nvrtc.include_closure(header, kernels_dir)
        if now != headers:
            raise InputChanged(f"a header of {header} changed while the build ran")
        try:
            built = build.compile_source(cand.real, source, src, now, arch)
        except CompileError as err:
            raise CompileError(f"{err}\n(generated source: {ctx.env.instance_dir / src})") from None
        return Result({cubin: built.cubin, report: to_json({"resources": built.report, "ptxas": built.log, "arch": arch,
                                                            "problems": build.report_problems(built.report)})})

    def ahead() -> tuple[dict, list[tuple]]:
        source = codegen.source(cand.real)
        return {f"codegen:{cand.id}": {src: digest.of_bytes(source.encode())}}, [(source, src, headers, arch)]

    return Step(f"compile:{cand.id}", f"NVRTC-compile {cand.real.name} for {arch}", reads, run, COMPILE_CODE,
                upstream=(f"codegen:{cand.id}",), targets=(cubin, report), ahead=ahead)


def served_shapes(cand: matrix_plan.Candidate, cls) -> list[tuple[int, int, int]]:
    return [shape for i, shape in enumerate(cls.shapes) if cand.serves(i)]


def _validate_step(cand: matrix_plan.Candidate, cls, hardware: hw.Hardware, prof) -> Step:
    shapes = served_shapes(cand, cls)
    reads = {**validation.settings(prof), "hardware": hardware.identity(), "realisation": cand.real.as_dict(),
             "awkward": [p.as_dict() for p in validation.awkward_problems(cand.real)],
             "shapes": [list(s) for s in shapes]}
    cubin, report, out = f"cubin/{cand.id}.cubin", f"cubin/{cand.id}.json", f"validation/{cand.id}.json"

    def run(ctx) -> Result:
        binary = ctx.upstream(f"compile:{cand.id}", cubin)
        resources = json.loads(ctx.upstream(f"compile:{cand.id}", report))["resources"]
        outcome = validation.validate_on_device(cand.real, binary, resources, hardware, shapes,
                                                prof.timing_repetitions)
        return Result({out: to_json(outcome)}, cache=outcome["status"] != "unvalidated")

    return Step(f"validate:{cand.id}", f"check {cand.real.name} against float64 on {hardware.name}, and time it",
                reads, run, validate_code(cand.template), upstream=(f"compile:{cand.id}",), targets=(out,),
                local_state=row_validation.local_device_state, role="evidence")


def _select_step(m: MatrixBuild) -> Step:
    cands = m.candidates
    upstream = (f"plan:{OP}", *(f"validate:{c.id}" for c in cands), *(f"compile:{c.id}" for c in cands))
    out = f"select/{OP}.json"

    def run(ctx) -> Result:
        planned = json.loads(ctx.upstream(f"plan:{OP}", f"plan/{OP}.json"))
        results = {c.id: json.loads(ctx.upstream(f"validate:{c.id}", f"validation/{c.id}.json")) for c in cands}
        reports = {c.id: json.loads(ctx.upstream(f"compile:{c.id}", f"cubin/{c.id}.json")) for c in cands}
        untrusted = {c.id for c in cands if not ctx.trusted(f"validate:{c.id}")}
        return Result({out: to_json(matrix_select.select(planned, results, reports, untrusted))})

    return Step(f"select:{OP}", "choose the fastest valid matrix kernel of each class at each workload shape",
                {"op": OP, "classes": [c.name for c in m.classes]}, run, SELECT_CODE, upstream=upstream,
                targets=(out,), role="verdict")


def steps(m: MatrixBuild, prof, hardware: hw.Hardware, kernels_dir: Path) -> list[Step]:
    found = [_legality_step(m, prof), _plan_step(m, prof)]
    for plan in m.plans:
        for cand in plan.candidates:
            found += [_codegen_step(cand), _compile_step(cand, m.arch, kernels_dir),
                      _validate_step(cand, plan.cls, hardware, prof)]
    found.append(_select_step(m))
    return found
