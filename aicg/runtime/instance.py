"""aicg.load: a packaged instance as callable kernels.

    inst = aicg.load("build/h100-tolerance")
    y = inst.softmax(x)                 # x: (..., cols) CUDA tensor, float32, bfloat16 or float16
    y = inst.rmsnorm(x, w, eps=1e-6)
    y = inst.layernorm(x, w, b)
    y = inst.matmul(a, b, bias=None, residual=None, activation=None)   # where the profile has [[matmul]]
    y = inst.linear(x, weight, bias=None)                              # x @ weight.T + bias
    help(inst.rmsnorm)                  # its signature, what it computes, the dtypes it has

x, and a fused operator's residual, may have rows lying evenly apart (a
slice x[:, :n] of a wider matrix, last dimension contiguous): kernels take a
row stride; w, b and out are contiguous. Kernels run on the caller's
current stream with no host synchronisation.
Each cubin is checked against the digest in the manifest before it is
loaded. Kernels the build could not validate on the target (or whose
validation came from an unsigned remote store) are refused unless
`allow_unvalidated=True`. The instance directory is trusted as the user's own
files; with a signing key (AICG_SIGNING_KEY_FILE, or `signing_key=`), the
manifest must carry the build's signature (manifest.json.sig) and the JIT's
records theirs (aicg/trust.py).

A workload shape runs the kernel the build measured fastest there. Any
other shape is planned on first use with the instance's own rules and
priors (aicg/runtime/jit.py): the first call runs the predicted fastest
kernel that is valid, so it does not wait for alternatives to be timed. Where
that kernel must be compiled and the instance carries one that runs the
shape, the first call runs the carried one while the predicted fastest
compiles on a thread; the first call after that thread has finished
validates it on the device and runs it from then on. `inst.tune()` then times the best few candidates of every shape served
so far and keeps the fastest (`load(..., tune="first call")` does that on each
new shape's first call instead); choices and outcomes are cached. A matrix
multiply at a shape outside the workload runs the packaged kernel estimated
fastest there; `inst.tune()` plans, compiles, validates and times realisations
for it too (aicg/matrix/jit.py).
`inst.jit_events` lists what that compiled, validated and timed, with times;
`load(..., jit=False)` runs the nearest workload shape's kernel instead.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path

from .. import codegen, digest, nvrtc, trust
from ..dtypes import DTYPES
from ..errors import InputError
from ..ops import OPERATORS
from ..matrix.dispatch import MatrixKernels
from ..matrix.jit import MatrixJit
from ..semantics import accuracy
from . import arrays, driver, memo, torch_ops
from .memo import Memo
from .jit import Jit, JitError


log = logging.getLogger("aicg.jit")


class InstanceError(RuntimeError):
    pass


def nearest_variant(entry: dict, rows: int, cols: int) -> dict:
    """The kernel measured fastest on the workload shape nearest this one: row length first
    (it decides how a row is split), then row count; the operator's kernel without a table. Only
    kernels whose order keeps the profile's bound on rows of `cols` are considered."""
    table = [v for v in entry.get("dispatch") or [entry] if accuracy.keeps(v.get("longest_row"), cols)]
    if not table:
        longest = max(v["longest_row"] for v in entry.get("dispatch") or [entry])
        raise InstanceError(f"no packaged {entry.get('op', '')} {entry.get('dtype', '')} kernel keeps the profile's bound "
                            f"on rows of {cols} elements (their orders keep it on rows of at most {longest}); the JIT "
                            f"plans kernels for such rows (aicg.load(..., jit=True), an instance with its source/)")
    if len(table) == 1 and "cols" not in table[0]:
        return table[0]
    return min(table, key=lambda v: (abs(math.log(cols / v["cols"])) + 0.25 * abs(math.log(rows / v["rows"])),
                                     v["cols"], v["rows"]))


class OpKernels:
    """One operator of an instance, dispatching on the input's dtype."""

    def __init__(self, instance: "Instance", op: str, entries: dict[str, dict]):
        self.instance, self.op, self.entries = instance, OPERATORS[op], entries
        self.inputs = (*self.op.matrices, *self.op.vectors)   # named inputs after x, in call order
        self._loaded: dict[tuple[str, int], driver.Kernel] = {}
        self._by_shape: dict[tuple, tuple] = {}   # (dtype, device, rows, cols) -> _launch_for
        self.chosen: dict[tuple, str] = {}   # (dtype, rows, cols) -> the candidate that ran there
        self.untimed: set[tuple] = set()     # (dtype, device, rows, cols) served by the prior's pick alone
        # (dtype, device, rows, cols) served by a carried kernel while the JIT compiles the predicted
        # fastest on this thread: once it has finished, the shape is resolved again
        self._provisional: dict[tuple, object] = {}
        # PyTorch call signature -> what its first call worked out: (dtype, device, rows, cols, the
        # output's shape, the row strides); the kernel is looked up again on each call (_launch_for)
        self._repeats: dict[tuple, tuple] = Memo()

    def _launch_for(self, dtype: str, device: int, rows: int, cols: int, tune: bool = False) -> tuple:
        """(launcher, argument names in order, grid, block, dynamic shared bytes) of the kernel that
        serves this shape; `tune`: time the alternatives now, even if a kernel already serves it."""
        key = (dtype, device, rows, cols)
        if self._provisional:
            pending = self._provisional.get(key)
            if pending is not None and not pending.is_alive():
                del self._provisional[key]
                self._by_shape.pop(key, None)
        if key not in self._by_shape or (tune and key in self.untimed):
            if len(self._by_shape) >= memo.KEPT:    # many distinct shapes: keep the lookups bounded
                self._by_shape.clear()
                self.chosen.clear()
                self.untimed.clear()
                self._provisional.clear()
            kernel, entry, params = self._find_kernel(dtype, device, rows, cols, tune or self.instance.tune_first_call)
            names = tuple(entry["arguments"])
            grid, block, shared = codegen.launch_of(kernel, params, rows, cols, DTYPES[dtype].size)
            self._by_shape[key] = (kernel.launcher(tuple(self._kind(n) for n in names)), names, (grid, 1, 1),
                                   (block, 1, 1), shared)
        return self._by_shape[key]

    def _kind(self, argument: str) -> str:
        if argument in ("rows", "cols") or argument.endswith("_stride"):
            return "int"
        return "float" if argument in dict(self.op.scalars) else "ptr"

    def _find_kernel(self, dtype: str, device: int, rows: int, cols: int,
                     tune: bool = False) -> tuple[driver.Kernel, dict, dict]:
        entry = self.entries.get(dtype)
        if entry is None:
            raise InstanceError(f"{self.instance.path}: no {self.op.name} kernel for {dtype} "
                                f"(this instance has: {', '.join(sorted(self.entries)) or 'none'})")
        tuned = any((v["rows"], v["cols"]) == (rows, cols) for v in entry.get("dispatch") or [])
        if not tuned and self.instance.jit is not None:
            made = self._jit_kernel(entry, dtype, device, rows, cols, tune)
            if made is not None:
                return made
        variant = nearest_variant(entry, rows, cols)
        if (variant["cubin"], device) not in self._loaded:
            cubin = trust.packaged_cubin(self.instance.path, variant, InstanceError)
            driver.use_primary_context(device)
            self._loaded[(variant["cubin"], device)] = driver.Kernel(cubin, entry["entry"])
        self.chosen[(dtype, rows, cols)] = variant.get("candidate", entry["candidate"])
        return self._loaded[(variant["cubin"], device)], entry, variant["params"]

    def _jit_kernel(self, entry: dict, dtype: str, device: int, rows: int, cols: int, tune: bool):
        """The JIT's kernel for an untuned shape, or None to run the nearest tuned shape's. Without
        `tune`, the prior's first valid pick (or the choice timed earlier), timing nothing."""
        try:
            nearest = nearest_variant(entry, rows, cols)
        except InstanceError:     # no carried kernel keeps the bound on these rows
            nearest = None
        try:
            made = self.instance.jit.kernel_for(self.op.name, dtype, rows, cols, validate=self._validator(dtype),
                                                timer=self._timer(dtype) if tune else None, background=not tune,
                                                nearest=nearest if nearest and "candidate" in nearest else None)
        except JitError as err:
            log.warning("aicg: %s; running the nearest tuned shape's kernel", err)
            return None
        if made.validation != "passed" and not self.instance.allow_unvalidated:
            log.warning("aicg: %s for %dx%d is %s on this GPU; running the nearest tuned shape's kernel",
                        made.candidate, rows, cols, made.validation)
            return None
        key = (f"jit:{digest.of_bytes(made.cubin)}", device)
        if key not in self._loaded:
            driver.use_primary_context(device)
            self._loaded[key] = driver.Kernel(made.cubin, entry["entry"])
        self.chosen[(dtype, rows, cols)] = made.candidate
        (self.untimed.add if made.timed is False else self.untimed.discard)((dtype, device, rows, cols))
        if made.pending is not None:
            self._provisional[(dtype, device, rows, cols)] = made.pending
        return self._loaded[key], entry, made.params

    def _validator(self, dtype: str):
        from .. import validate
        planned = self.instance.jit.planning()

        def run(cubin: bytes, params: dict, shape) -> dict:
            longest = accuracy.longest_row(planned.rules, self.op.name, dtype, params,
                                           planned.prof.preservation.tolerance[dtype][0])
            settings = validate.settings(planned.prof, dtype, (), (shape,), longest_row=longest)
            report = validate.validate_on_device(cubin, planned.hardware, self.op.name, dtype, params, **settings)
            return {"status": report["status"], "reason": validate.why_failed(report)}
        run.prepare = _start_validation_worker
        return run

    def _timer(self, dtype: str):
        from .. import validate
        planned = self.instance.jit.planning()

        def run(kernels, shape) -> list[float] | None:
            return validate.time_on_device(kernels, planned.hardware, self.op.name, dtype, shape,
                                           planned.prof.timing_repetitions)
        return run

    def _scalar_values(self, scalars: dict) -> dict[str, float]:
        """Every scalar of the operator: the call's, else its default."""
        return {name: float(scalars.get(name, default)) for name, default in self.op.scalars}

    def _repeat(self, x, inputs: tuple, scalars: dict):
        """(the call's signature, None where it has none: PyTorch CUDA tensors; its output, where a call
        of that signature ran before: the kernel serving that shape launched on these tensors into a
        new one, on PyTorch's current stream, else None)."""
        signed = arrays.torch_signature((x, *inputs)) if len(inputs) == len(self.inputs) else None
        if signed is None:
            return None, None
        key = (signed[0], tuple(scalars))
        found = self._repeats.get(key)
        if found is None:
            return key, None
        dtype, device, rows, cols, out_shape, strides = found
        launch, arguments, grid, block, shared = self._launch_for(dtype, device, rows, cols)
        result = x.new_empty(out_shape)
        values = {"y": result.data_ptr(), "rows": rows, "cols": cols, **strides}
        values.update(zip(("x", *self.inputs), signed[1]))
        values.update(self._scalar_values(scalars))
        launch(grid, block, [values[n] for n in arguments], arrays.torch_current_stream(x, device), shared)
        return key, result

    def __call__(self, x, *inputs, out=None, stream=None, **scalars):
        """x, then the operator's further matrices (shaped like x), then its per-column vectors."""
        repeat_key = None
        if out is None and stream is None:
            repeat_key, found = self._repeat(x, inputs, scalars)
            if found is not None:
                return found
        op, named = self.op, self.inputs
        if len(inputs) != len(named):
            raise TypeError(f"{op.name} takes x and {len(named)} more input(s) ({', '.join(named) or 'none'}), "
                            f"got {len(inputs)}")
        unknown = set(scalars) - {name for name, _ in op.scalars}
        if unknown:
            raise TypeError(f"{op.name} has no argument {sorted(unknown)[0]!r}")
        xv = arrays.view(x, "x")
        if not xv.shape:
            raise ValueError("x: expected at least one dimension (rows are the last one)")
        cols = xv.shape[-1]
        rows = math.prod(xv.shape[:-1])
        vector_views = []
        for name, v in zip(named, inputs):
            vv = arrays.view(v, name)
            shape = tuple(xv.shape) if name in op.matrices else (cols,)
            if vv.shape != shape or vv.dtype != xv.dtype:
                raise ValueError(f"{name}: expected shape {shape} and dtype {xv.dtype}, got {vv.shape} {vv.dtype}")
            if name not in op.matrices and not vv.dense:
                raise ValueError(f"{name}: expected a contiguous vector, got one with stride {vv.row_stride}")
            vector_views.append(vv)
        out_shape = tuple(xv.shape) if op.output == "matrix" else tuple(xv.shape[:-1])
        if out is None:
            ov = arrays.empty_like(xv, out_shape)
        else:
            ov = arrays.view(out, "out")
            if ov.shape != out_shape or ov.dtype != xv.dtype:
                raise ValueError(f"out: expected shape {out_shape} and dtype {xv.dtype}, got {ov.shape} {ov.dtype}")
            if not ov.dense:   # only inputs may be strided: kernels write their output densely
                raise ValueError(f"out: expected a contiguous array, got rows {ov.row_stride} elements apart")
        if rows == 0 or cols == 0:   # nothing to compute: no kernel is planned, compiled or launched
            return ov.obj
        if rows >= 2**31 or cols >= 2**31 or max([xv.row_stride] + [v.row_stride for v in vector_views]) >= 2**31:
            raise ValueError(f"x: rows, cols and row strides must each be below 2**31, got {rows} x {cols}")
        launch, arguments, grid, block, shared = self._launch_for(xv.dtype, xv.device, rows, cols)
        values = {"x": xv.ptr, "y": ov.ptr, "rows": rows, "cols": cols, "x_stride": xv.row_stride}
        for name, vv in zip(named, vector_views):
            values[name] = vv.ptr
            if name in op.matrices:
                values[f"{name}_stride"] = vv.row_stride
        values.update(self._scalar_values(scalars))
        launch(grid, block, [values[n] for n in arguments],
               arrays.current_stream(xv) if stream is None else int(stream), shared)
        if repeat_key is not None:
            strides = {n: v for n, v in values.items() if n.endswith("_stride")}
            self._repeats[repeat_key] = (xv.dtype, xv.device, rows, cols, out_shape, strides)
        return ov.obj


def _signing_key(given: bytes | None) -> bytes | None:
    if given is not None:
        return given
    try:
        return trust.key_from_environment()
    except InputError as err:
        raise InstanceError(str(err)) from None


TUNE_MODES = ("explicit", "first call")
_worker_started: list = []


def _start_validation_worker() -> None:
    """Start the process validations run in (aicg/validate/isolated.py) and its CUDA context, in the
    background, once: a JIT compiling its first kernel of the process then validates it without
    waiting for an interpreter, its imports and a context to start (they take about as long as NVRTC)."""
    if _worker_started or driver.probe_device() is None:
        return
    from ..validate import isolated

    def start() -> None:
        try:
            isolated.worker.call("aicg.validate:local_device_state")
        except Exception as err:      # the validation itself starts a worker again and reports what fails
            log.debug("aicg: the validation worker did not start ahead: %s", err)
    _worker_started.append(threading.Thread(target=start, name="aicg validation worker start", daemon=True))
    _worker_started[0].start()


class Instance:
    def __init__(self, path, allow_unvalidated: bool = False, jit: bool = True, signing_key: bytes | None = None,
                 tune: str = "explicit"):
        if tune not in TUNE_MODES:
            raise ValueError(f"tune: expected one of {', '.join(map(repr, TUNE_MODES))}, got {tune!r}")
        self.path = Path(path)
        self.allow_unvalidated = allow_unvalidated
        self.tune_first_call = tune == "first call"
        manifest_path = self.path / "manifest.json"
        if not manifest_path.is_file():
            raise InstanceError(f"{manifest_path}: no manifest; build the instance with `doit build` first")
        data = manifest_path.read_bytes()
        key = _signing_key(signing_key)
        if key is not None and not trust.signed_by(manifest_path, data, key):
            raise InstanceError(f"{manifest_path}: not signed with the configured signing key "
                                f"({trust.signature_path(manifest_path).name} is missing or does not match); rebuild "
                                f"the instance with {trust.KEY_VARIABLE} set, or load it without a key to trust the "
                                f"directory as it is")
        try:
            self.manifest = json.loads(data)
        except ValueError as err:
            raise InstanceError(f"{manifest_path}: not a manifest ({err})") from None
        by_op: dict[str, dict[str, dict]] = {}
        for name, entry in self.manifest["kernels"].items():
            if entry["validation"] != "passed" and not allow_unvalidated:
                continue
            by_op.setdefault(entry["op"], {})[entry["dtype"]] = entry
        self.skipped = sorted(n for n, e in self.manifest["kernels"].items()
                              if e["validation"] != "passed" and not allow_unvalidated)
        self.ops = {op: OpKernels(self, op, entries) for op, entries in by_op.items()}
        section = self.manifest.get("matrix")
        # matrix multiplies (inst.matmul, inst.linear): their kernels dispatch on layouts and shape
        matrix_jit = None
        if section and jit and MatrixJit.carried_by(self.path):
            matrix_jit = MatrixJit(self.path, {c: k for e in section["classes"].values() for c, k in e["kernels"].items()},
                                   self.manifest["target"]["name"], key)
        self.matrix = MatrixKernels(self.path, section, allow_unvalidated, InstanceError, matrix_jit) if section else None
        if self.matrix is not None:
            self.skipped += self.matrix.skipped
        # every kernel the instance carries, by candidate: each of a dispatch table, or the one kernel
        # an operator without a table has (the JIT runs them without compiling); an entry that names
        # no candidate (a manifest written without them) offers the JIT nothing
        packaged = {v["candidate"]: v for entries in by_op.values() for e in entries.values()
                    for v in e.get("dispatch") or ([e] if "candidate" in e else [])}
        self.jit = (Jit(self.path, packaged, key) if jit and (self.path / "source" / "profile.toml").is_file()
                    else None)
        if self.jit is not None or matrix_jit is not None:
            nvrtc.warm_up_in_background()   # a first call that must compile does not pay NVRTC's start
        # each operator a function with its signature on the instance, and a PyTorch custom
        # operator in this namespace where PyTorch is installed (None otherwise)
        self.namespace = torch_ops.attach(self)

    def tune(self) -> list[tuple]:
        """Time the best few candidates of every shape the JIT has served with its first pick alone,
        and run the fastest from now on (the choice is cached for later processes); likewise for the
        matrix multiplies called at shapes outside the workload (aicg/matrix/jit.py: planned,
        compiled and validated first). Returns the (op, dtype, rows, cols) and ("matmul", class, m,
        n, k) it tuned. Call it where a pause is affordable: after a warm-up pass."""
        tuned = []
        if self.jit is not None:
            self.jit.wait()     # what compiles on its own threads is timed too, not compiled twice
        for op in self.ops.values():
            for dtype, device, rows, cols in sorted(op.untimed):
                op._launch_for(dtype, device, rows, cols, tune=True)
                tuned.append((op.op.name, dtype, rows, cols))
        if self.matrix is not None and self.matrix.jit is not None:
            tuned += [("matmul", *shape) for shape in self.matrix.tune()]
        return tuned

    @property
    def jit_events(self) -> list[dict]:
        """What the JIT compiled, validated and timed in this process, with times."""
        matrix = self.matrix.jit.events if self.matrix is not None and self.matrix.jit is not None else []
        return (self.jit.events if self.jit is not None else []) + matrix

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__dict__.get("ops", {})))

    def __getattr__(self, name: str) -> OpKernels:
        ops = self.__dict__.get("ops", {})
        if name in ops:
            return ops[name]
        why = ""
        if name in torch_ops.MATRIX_OPS and self.__dict__.get("matrix") is not None:
            why = " (its matrix kernels are not validated on the target; load with allow_unvalidated=True to use them anyway)"
        elif any(n.startswith(name + ".") for n in self.__dict__.get("skipped", [])):
            why = " (its kernels are not validated on the target; load with allow_unvalidated=True to use them anyway)"
        raise AttributeError(f"instance {self.__dict__.get('path')} has no operator {name!r}{why}")


def load(path, allow_unvalidated: bool = False, jit: bool = True, signing_key: bytes | None = None,
         tune: str = "explicit") -> Instance:
    """The packaged instance at `path` (build/<instance>) as callable operators: `inst.softmax(x)`.

    Each operator is a function on the instance with its own signature and docstring
    (`inst.rmsnorm(x, w, *, eps=1e-05, out=None, stream=None)`; `dir(inst)` lists them) taking
    CUDA arrays of PyTorch, CuPy or any DLPack / __cuda_array_interface__ framework. Where PyTorch
    is installed, each is also a PyTorch custom operator, `torch.ops.<inst.namespace>.<op>`, that
    torch.compile traces and CUDA graphs capture (aicg/runtime/torch_ops.py); `aicg.backend(inst)`
    lowers torch.compile's graphs onto them (aicg/fx, docs/pytorch.md).

    allow_unvalidated: also expose kernels not validated on the target (or validated only by an
    unsigned remote store). jit: plan, compile and validate kernels for shapes outside the workload
    on first use. signing_key: check the manifest's and the JIT records' signatures with this key
    (default: the key in AICG_SIGNING_KEY_FILE, if set; without one the directory is trusted).
    tune: "explicit" (a new shape's first call runs the prior's best valid kernel; `inst.tune()`
    times the alternatives) or "first call" (the first call times them before answering).
    """
    return Instance(path, allow_unvalidated, jit, signing_key, tune)
