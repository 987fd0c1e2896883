"""An instance's matrix kernels at run time: `inst.matmul` and `inst.linear`.

    y = inst.matmul(a, b, bias=None, residual=None, activation=None)   # act(a @ b + bias) + residual
    y = inst.linear(x, weight, bias=None)                              # x @ weight.T + bias (F.linear)

a is (M, K) or (..., K); b is (K, N); x is (..., K); weight is (N, K); bias
is (N,); residual is shaped like the output, (..., N); activation is None,
"gelu_tanh", "gelu_erf" or "silu". Every array is bfloat16 or float16 (the
same one), on one GPU. The layout of each operand is read from its strides:
a row-major matrix, or the transpose of one (a column-major view such as
`w.t()`), with rows (or columns) any distance apart; the instance must have
kernels for that dtype, pair of layouts and epilogue (the profile's
`[[matmul]]` classes), or the call fails saying which it has.

A workload shape runs the kernel its build measured fastest there. Any
other shape runs, of the packaged kernels of its class that take it (layout,
leading dimensions, pointer alignment, and an error bound at its K within the
profile's rtol), the one estimated fastest there: the prior's model corrected
by the kernel's own times at the nearest workload shapes
(aicg/matrix/estimate.py). Every packaged kernel was validated on ragged
shapes too (aicg/matrix/validation.py), so it is correct at any shape it takes.
Kernels the build did not validate on the target are refused unless the
instance was loaded with allow_unvalidated=True. The kernels are built for
the target's architecture (sm_90a: compute capability 9.0 only); another GPU
is refused before anything loads. A kernel runs on the caller's current
stream (the array framework's) with no host synchronisation. A kernel that
splits K keeps its partial sums in scratch memory of its own: launch one
instance's kernel on one stream at a time.

A PyTorch call whose tensors have the shapes, strides, dtype, device and
address alignment of an earlier call runs that call's kernel with none of the
work above done again: the choice depends on nothing else, and a model's
forward repeats its calls, where the host's time per call sets the pace.
"""
from __future__ import annotations

from typing import NamedTuple

from .. import trust
from ..runtime import arrays, driver
from ..runtime.memo import Memo
from . import accuracy, estimate
from .jit import Kernel, MatrixJit
from .calls import Call, Operand, dense_strides, linear_call, matmul_call, operand
from .problem import Problem
from .space import Epilogue, Realisation
from .templates import RULES


class ClassKernels:
    """One class of the manifest: its dispatch table and its usable kernels."""

    def __init__(self, name: str, entry: dict, usable: dict[str, dict], model_inputs: dict):
        self.name, self.entry, self.usable, self.model_inputs = name, entry, usable, model_inputs
        self.key = (entry["dtype"], entry["a_major"], entry["b_major"], Epilogue(**entry["epilogue"]))
        self.rtol = entry["rtol"]
        self.exact = {(d["m"], d["n"], d["k"]): d["candidate"] for d in entry["dispatch"]
                      if d["candidate"] in usable}
        self.kernels = {c: Kernel(c, Realisation.from_dict(k["realisation"])) for c, k in usable.items()}
        self.known = {c: estimate.known_seconds(k, entry["shapes"]) for c, k in usable.items()}
        self._rankings: dict[tuple[int, int, int], list[str]] = Memo()

    def is_workload(self, problem: Problem) -> bool:
        return (problem.m, problem.n, problem.k) in self.exact

    def ranked(self, problem: Problem) -> list[str]:
        """The usable kernels, estimated fastest at `problem` first (ties by name)."""
        key = (problem.m, problem.n, problem.k)
        if key not in self._rankings:
            self._rankings[key] = sorted(self.usable, key=lambda c: (estimate.seconds_at(
                self.kernels[c].realisation, problem, self.known[c], self.model_inputs), c))
        return self._rankings[key]

    def _bound_exceeded(self, kernel: Kernel, problem: Problem, splits) -> str | None:
        """Why the kernel's error bound at this K does not fit the class's rtol (None: it fits). The most
        parts any launch cuts K into (one per k16 step) is tried first; past it, the launch's own."""
        k, dtype, epilogue = problem.k, problem.dtype, problem.epilogue
        rounded = RULES[kernel.realisation.template].rounds_sum(kernel.realisation)
        if accuracy.keeps(dtype, k, -(-k // 16), epilogue, self.rtol, rounded):
            return None
        parts = splits(kernel, problem) if splits else -(-k // 16)
        if accuracy.keeps(dtype, k, parts, epilogue, self.rtol, rounded):
            return None
        return (f"its error bound at k = {k} in {parts} part(s), "
                f"{accuracy.relative_bound(dtype, k, parts, epilogue, rounded):.3g}, exceeds the profile's rtol "
                f"{self.rtol:g}")

    def refusal(self, kernel: Kernel, problem: Problem, pointers: dict[str, int], splits=None) -> str | None:
        """Why `kernel` cannot take this call (None: it can)."""
        real = kernel.realisation
        reason = RULES[real.template].unsupported(real, problem)
        alignment = RULES[real.template].operand_alignment(real)
        if reason is None and any(pointers[o] % alignment for o in ("a", "b")):
            reason = f"a and b must be {alignment}-byte aligned"
        return reason or self._bound_exceeded(kernel, problem, splits)

    def choose(self, problem: Problem, pointers: dict[str, int], splits=None,
               tuned: Kernel | None = None) -> tuple[Kernel | None, list[str]]:
        """(the kernel for this call, or None; why each other kernel could not take it): the workload
        shape's, else `tuned` (what inst.tune() chose at this shape), else the one estimated fastest.
        `splits(kernel, problem)`: the parts its launch cuts K into (asked only at depths where it matters)."""
        why = []

        def takes(kernel: Kernel) -> bool:
            reason = self.refusal(kernel, problem, pointers, splits)
            if reason:
                why.append(f"{kernel.candidate}: {reason}")
            return reason is None
        exact = self.exact.get((problem.m, problem.n, problem.k))
        for kernel in (self.kernels.get(exact), tuned):
            if kernel is not None and takes(kernel):
                return kernel, why
        return next((self.kernels[c] for c in self.ranked(problem) if c != exact and takes(self.kernels[c])),
                    None), why


def _packed(problem: Problem) -> Problem:
    """The call's shape with tightly packed operands, as a shape is planned, validated and timed."""
    return Problem(problem.m, problem.n, problem.k, problem.dtype, problem.a_major, problem.b_major, problem.epilogue)


class _Repeat(NamedTuple):
    """What a call worked out, for the next call of the same signature (PyTorch tensors)."""
    loaded: object            # the MatmulKernel
    problem: Problem
    out_shape: tuple[int, ...]


def _torch_signature(tensors) -> tuple[tuple, tuple[int, ...]] | None:
    """arrays.torch_signature, with the alignment a's and b's addresses share: a kernel's choice
    depends on it."""
    signed = arrays.torch_signature(tensors)
    if signed is None:
        return None
    low = (signed[1][0] | signed[1][1]) & 255
    return (*signed[0], low & -low if low else 256), signed[1]


class MatrixKernels:
    """The matrix section of an instance's manifest, as callable kernels."""

    def __init__(self, path, section: dict, allow_unvalidated: bool, error=RuntimeError, jit: MatrixJit | None = None):
        self.path, self.section, self.error, self.jit = path, section, error, jit
        lacking = [key for key in ("model_inputs",) if key not in section] + [
            f"{name}.{key}" for name, entry in section["classes"].items() for key in ("shapes", "rtol") if key not in entry]
        if lacking:
            raise error(f"{path / 'manifest.json'}: its matrix section has no {lacking[0]} (an instance built by an "
                        f"earlier aicg); build it again")
        self.compute_capability = tuple(section["compute_capability"])
        self.classes: dict[tuple, ClassKernels] = {}
        self.skipped: list[str] = []
        for name, entry in section["classes"].items():
            usable = {c: k for c, k in entry["kernels"].items() if k["validation"] == "passed" or allow_unvalidated}
            self.skipped += [f"{name}: {c}" for c in entry["kernels"] if c not in usable]
            if usable:
                cls = ClassKernels(name, entry, usable, section["model_inputs"])
                self.classes[cls.key] = cls
        self._loaded: dict[tuple[str, int], object] = {}
        self._checked_devices: set[int] = set()
        self.chosen: dict[tuple, str] = {}     # (class name, m, n, k) -> the kernel that ran there
        self.tuned: dict[tuple, Kernel | None] = {}      # (class name, m, n, k) -> inst.tune()'s choice there
        self.untuned: dict[tuple, tuple[ClassKernels, Kernel]] = {}   # shapes outside the workload run untimed
        self._tune_tried: set[tuple] = set()     # shapes tune() worked on in this process, chosen or not
        self._repeats: dict[tuple, _Repeat] = Memo()  # (operator, activation, signature) -> what that call worked out

    def has(self) -> bool:
        return bool(self.classes)

    def _class_for(self, call: Call) -> tuple[ClassKernels, Problem]:
        for problem in call.problems:
            found = self.classes.get((problem.dtype, problem.a_major, problem.b_major, problem.epilogue))
            if found:
                return found, problem
        p = call.problems[0]
        asked = " or ".join(sorted({f"{q.a_major}{q.b_major}" for q in call.problems}))
        have = ", ".join(sorted(c.name for c in self.classes.values())) or "none"
        skipped = " (some kernels are not validated on the target; load with allow_unvalidated=True to use them)" \
            if self.skipped else ""
        raise ValueError(f"no matrix kernels for {p.dtype}, layouts (A, B) {asked}, epilogue {p.epilogue.name} in "
                         f"{self.path}: it has {have}{skipped}; add the class to the profile's [[matmul]] entries")

    def _check_device(self, device: int) -> None:
        if device in self._checked_devices:
            return
        info = driver.probe_device(device)
        cc = tuple(info.compute_capability) if info else None
        if cc != self.compute_capability:
            raise self.error(f"{self.path}: its matrix kernels are built for {self.section['arch']} (compute capability "
                             f"{'.'.join(map(str, self.compute_capability))}) and cannot run on "
                             f"{info.name if info else 'this machine'} (compute capability "
                             f"{'.'.join(map(str, cc)) if cc else 'none'}); build the profile for it (target=auto)")
        self._checked_devices.add(device)

    def _kernel(self, cls: ClassKernels, kernel: Kernel, device: int):
        key = (kernel.candidate, device)
        if key not in self._loaded:
            from .launch import MatmulKernel
            cubin = kernel.cubin or trust.packaged_cubin(self.path, cls.usable[kernel.candidate], self.error)
            driver.use_primary_context(device)
            self._loaded[key] = MatmulKernel(kernel.realisation, cubin)
        return self._loaded[key]

    def pick(self, cls: ClassKernels, problem: Problem, pointers: dict[str, int], splits=None) -> Kernel:
        """The kernel for a call (ValueError where none takes it): the workload shape's, else what
        inst.tune() chose at this shape, else the packaged kernel estimated fastest, noted for tune()."""
        shape = (cls.name, problem.m, problem.n, problem.k)
        tunable = self.jit is not None and not cls.is_workload(problem)
        if tunable and shape not in self.tuned:
            self.tuned[shape] = self.jit.choice(cls.name, _packed(problem))
        kernel, why = cls.choose(problem, pointers, splits, self.tuned.get(shape))
        if kernel is None:
            raise ValueError(f"no packaged kernel of {cls.name} takes {problem.name}: " + "; ".join(why))
        if tunable and self.tuned[shape] is None and shape not in self._tune_tried:
            self.untuned.setdefault(shape, (cls, kernel))
        return kernel

    def tune(self) -> list[tuple]:
        """inst.tune()'s matrix part (aicg/matrix/jit.py): at each shape outside the workload called so
        far, plan, compile, validate and time the prior's best realisations beside the kernel running
        there, and run the fastest valid one from now on. Returns the (class, m, n, k) it tuned."""
        done = []
        for shape, (cls, running) in sorted(self.untuned.items(), key=lambda kv: kv[0]):
            problem = Problem(*shape[1:], *cls.key)
            self.jit.tune(cls.name, problem, running)
            self.tuned[shape] = self.jit.choice(cls.name, problem)
            self._tune_tried.add(shape)
            done.append(shape)
        self.untuned = {s: v for s, v in self.untuned.items() if s not in done}
        self._repeats.clear()      # tuned shapes now run another kernel
        return done

    def run(self, call: Call, like: Operand, out=None, stream=None, repeat_key: tuple | None = None):
        """Launch the call's kernel into `out` (a new array like `like` where None); returns the output.
        `repeat_key`: the call's signature, under which what it worked out is kept for the next."""
        if out is None:
            view = arrays.empty_like(arrays.DeviceArray(like.obj, like.ptr, like.shape, like.dtype, like.device,
                                                        like.shape[-1]), call.out_shape)
            out_obj, out_ptr = view.obj, view.ptr
        else:
            o = operand(out, "out")
            if o.shape != call.out_shape or o.dtype != call.dtype or o.device != call.device:
                raise ValueError(f"out: expected shape {call.out_shape}, dtype {call.dtype} on GPU {call.device}, got "
                                 f"{o.shape} {o.dtype} on GPU {o.device}")
            if o.strides != dense_strides(o.shape):
                raise ValueError(f"out: expected a contiguous array, got strides {o.strides}")
            out_obj, out_ptr = out, o.ptr
        if not call.problems:     # M or N is zero: nothing to compute
            return out_obj
        cls, problem = self._class_for(call)
        pointers = {**call.pointers, "c": out_ptr}

        def splits(kernel: Kernel, at: Problem) -> int:
            from .check import splits_of
            self._check_device(call.device)
            return splits_of(kernel.realisation.template, self._kernel(cls, kernel, call.device).geometry(at))
        chosen = self.pick(cls, problem, pointers, splits)
        self._check_device(call.device)
        loaded = self._kernel(cls, chosen, call.device)
        if stream is None:
            stream = arrays.current_stream(arrays.DeviceArray(like.obj, like.ptr, like.shape, like.dtype, like.device,
                                                              like.shape[-1] if like.shape else 1))
        loaded.launch(problem, pointers, int(stream))
        self.chosen[(cls.name, problem.m, problem.n, problem.k)] = chosen.candidate
        if repeat_key is not None:
            self._repeats[repeat_key] = _Repeat(loaded, problem, call.out_shape)
        return out_obj

    def _repeat(self, name: str, activation, tensors: tuple, out, stream) -> tuple[tuple | None, object]:
        """(the call's signature, None where it has none: PyTorch tensors, a new output on the current
        stream; its output, where a call of that signature ran before: that call's kernel launched
        on these tensors into a new one, else None)."""
        signed = _torch_signature(tensors) if out is None and stream is None else None
        if signed is None:
            return None, None
        key, pointers = (name, activation, signed[0]), signed[1]
        found = self._repeats.get(key)
        if found is None:
            return key, None
        a = tensors[0]
        result = a.new_empty(found.out_shape)
        given = {"a": pointers[0], "b": pointers[1], "c": result.data_ptr()}
        if found.problem.epilogue.bias:
            given["bias"] = pointers[2]
        if found.problem.epilogue.residual:
            given["residual"] = pointers[3]
        found.loaded.launch(found.problem, given, arrays.torch_current_stream(a, a.get_device()))
        return key, result

    def matmul(self, a, b, bias=None, residual=None, activation=None, *, out=None, stream=None):
        key, found = self._repeat("matmul", activation, (a, b, bias, residual), out, stream)
        if found is not None:
            return found
        ops = {"a": operand(a, "a"), "b": operand(b, "b")}
        extra = {name: operand(v, name) for name, v in (("bias", bias), ("residual", residual)) if v is not None}
        call = matmul_call(ops["a"], ops["b"], extra.get("bias"), extra.get("residual"), activation)
        return self.run(call, ops["a"], out, stream, key)

    def linear(self, x, weight, bias=None, *, out=None, stream=None):
        key, found = self._repeat("linear", None, (x, weight, bias, None), out, stream)
        if found is not None:
            return found
        xo, wo = operand(x, "x"), operand(weight, "weight")
        call = linear_call(xo, wo, operand(bias, "bias") if bias is not None else None)
        return self.run(call, xo, out, stream, key)
