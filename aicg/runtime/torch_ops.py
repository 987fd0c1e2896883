"""An instance's operators as functions with signatures and, where PyTorch is installed,
as PyTorch custom operators.

`aicg.load` puts one function per operator on the instance (`inst.rmsnorm`), with the
operator's own signature and a docstring saying what it computes and which dtypes the
instance has kernels for:

    rmsnorm(x, w, *, eps=1e-05, out=None, stream=None)

Where PyTorch can be imported, each operator is also a custom operator
(defined with torch.library.Library) in a namespace of its own per loaded instance,
`aicg_<instance name>` (then `_2`, `_3`... for later loads in one process):
`torch.ops.aicg_h200_tolerance.rmsnorm(x, w, eps=1e-5)`, and `rmsnorm_out(x, w, out,
eps=...)` for `out=`. A fake implementation gives the output's shape and dtype, so that
torch.compile traces through an operator with no graph break and the meta device runs
it. The kernels launch on PyTorch's current stream with no host synchronisation, so a CUDA
graph captures them (after a warm-up call at each shape: the first call at a new shape may
compile and validate a kernel, which no capture allows).

`inst.rmsnorm(x, w)` with CUDA tensors launches the kernel directly where nothing needs
the operator to be seen (no tracing, no dispatch mode, no gradient required): the
dispatcher costs more host time than the launch. Otherwise, and always within
torch.compile, it calls the registered operator. Other arrays (CuPy, DLPack) go to the
kernels as before.

Gradients: the forward runs the instance's kernel. softmax, log_softmax, rmsnorm and
layernorm have backward kernels (aicg/backward/: generated, compiled on first use and
validated on the device against float64 before their first launch), called through one
more custom operator per operator, `<op>_backward`, so that torch.compile traces the
backward too. Where the instance cannot serve a backward call with kernels (no legal
backward family at its preservation level, tensors off the GPU, a kernel not validated on
this GPU, an instance loaded with jit=False; `inst.backward.declined` says which), and for
every other operator, the backward is PyTorch's own formula in float32 (float64 for
float64 tensors), cast to each input's dtype; so is a backward that builds a graph itself
(create_graph=True: a second derivative). `out=` is not differentiable: a call with out=
while an input requires grad raises RuntimeError.
"""
from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import re
import sys
import tomllib

from ..backward.ops import BY_FORWARD as KERNEL_BACKWARDS
from ..backward.runtime import Backward
from ..ops import OPERATORS, Operator
from . import arrays

log = logging.getLogger("aicg")
_NAMESPACES: dict[str, object] = {}   # namespace -> the instance registered there (kept alive: its ops call it)
_LIBRARIES: dict[str, object] = {}    # namespace -> its torch.library.Library (its operators go when it does)


# --- signatures and docs (no PyTorch needed) ---------------------------------------------

def signature(op: Operator) -> inspect.Signature:
    """x, the operator's matrices and vectors positionally; scalars, out and stream by keyword."""
    P = inspect.Parameter
    params = [P(name, P.POSITIONAL_OR_KEYWORD) for name in ("x", *op.matrices, *op.vectors)]
    params += [P(name, P.KEYWORD_ONLY, default=default) for name, default in op.scalars]
    params += [P("out", P.KEYWORD_ONLY, default=None), P("stream", P.KEYWORD_ONLY, default=None)]
    return inspect.Signature(params)


def _form(instance, op: str) -> str | None:
    """The operator's definition in the atlas the instance was built with, where it carries one."""
    atlas = instance.path / "source" / "rulesets" / "atlas.toml"
    try:
        return tomllib.loads(atlas.read_text(encoding="utf-8"))["ops"][op]["form"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None


def docstring(instance, name: str, namespace: str | None) -> str:
    op = OPERATORS[name]
    dtypes = ", ".join(sorted(instance.ops[name].entries)) or "none"
    out_shape = "(..., cols)" if op.output == "matrix" else "(...,), one value a row"
    lines = [f"{name}{signature(op)}", ""]
    form = _form(instance, name)
    if form:
        lines += [form, ""]
    lines.append(f"x: (..., cols), rows of the last dimension, in {dtypes} (the dtypes this instance has "
                 f"kernels for); rows may lie evenly apart (the last dimension contiguous).")
    lines += [f"{m}: shaped like x, its rows may lie apart too." for m in op.matrices]
    lines += [f"{v}: (cols,), contiguous." for v in op.vectors]
    lines += [f"{s}: a number (default {d!r})." for s, d in op.scalars]
    lines += [f"out: a contiguous {out_shape} array of x's dtype to write into (default: a new one); returned.",
              "stream: the CUDA stream to launch on (default: the array framework's current stream).",
              f"Returns {out_shape}, x's dtype; every input in x's dtype and on x's GPU."]
    if namespace:
        lines += ["", f"PyTorch: torch.ops.{namespace}.{name}, and {name}_out for out=; torch.compile traces it and "
                      f"CUDA graphs capture it. " + _gradients_doc(namespace, name)]
    return "\n".join(lines)


def _gradients_doc(namespace: str, name: str) -> str:
    if name in KERNEL_BACKWARDS:
        return (f"Gradients come from the instance's backward kernels (torch.ops.{namespace}.{name}_backward), "
                f"PyTorch's formula where it has none for a call (inst.backward.declined says why).")
    return f"Gradients come from PyTorch's formula for {name} (no backward kernel)."


def _namespace(instance) -> str:
    base = "aicg_" + (re.sub(r"\W+", "_", str(instance.manifest.get("instance") or instance.path.name)).strip("_").lower()
                      or "instance")
    name, n = base, 1
    while name in _NAMESPACES:
        n += 1
        name = f"{base}_{n}"
    return name


def torch_installed() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def attach(instance) -> str | None:
    """Put each operator of `instance` on it as a function (`instance.softmax`), registered with
    PyTorch where PyTorch is installed; returns the PyTorch namespace, or None without PyTorch."""
    namespace = None
    registered: dict[str, tuple] = {}
    instance.backward = Backward(instance)
    if torch_installed():
        try:
            import torch  # noqa: F401
        except ImportError as err:   # installed but broken: the kernels still serve other frameworks
            log.warning("aicg: PyTorch does not import (%s); %s's operators are not registered with it",
                        err, instance.path)
        else:
            namespace = _namespace(instance)
            _NAMESPACES[namespace] = instance
            registered = {name: _register(instance, namespace, name) for name in sorted(instance.ops)}
    for name in instance.ops:
        if name in vars(type(instance)):
            raise RuntimeError(f"operator {name!r} would hide Instance.{name}")
        setattr(instance, name, InstanceOperator(instance, name, namespace, registered.get(name)))
    matrix = getattr(instance, "matrix", None)
    if matrix is not None and matrix.has():
        ops = _register_matrix(instance, namespace) if namespace else {}
        for name in MATRIX_OPS:
            setattr(instance, name, MatrixOperator(instance, name, namespace, ops.get(name)))
    return namespace


class InstanceOperator:
    """One operator of an instance, called as `inst.<name>(x, ...)`: see its docstring
    (`help(inst.rmsnorm)`). Attributes it does not have itself are those of the operator's
    kernels (aicg/runtime/instance.py OpKernels: `chosen`, `entries`, ...)."""

    def __init__(self, instance, name: str, namespace: str | None, torch_ops: tuple | None):
        op = OPERATORS[name]
        self._name, self._kernels = name, instance.ops
        self._inputs_wanted = len(op.matrices) + len(op.vectors)
        self._scalar_names = frozenset(s for s, _ in op.scalars)
        self._functional, self._out_variant = torch_ops or (None, None)
        self._torch = sys.modules["torch"] if torch_ops else None
        self._launch_directly = direct_launch_check(self._torch) if torch_ops else None
        self.__name__ = self.__qualname__ = name
        self.__signature__ = signature(op)
        self.__doc__ = docstring(instance, name, namespace)
        self._instance_name = instance.manifest.get("instance") or instance.path.name

    def __call__(self, x, *inputs, out=None, stream=None, **scalars):
        torch, name = self._torch, self._name
        if torch is not None and stream is None and isinstance(x, torch.Tensor):
            if len(inputs) != self._inputs_wanted or not self._scalar_names.issuperset(scalars):
                return self._kernels[name](x, *inputs, out=out, **scalars)   # its TypeError names what is wrong
            if out is not None and torch.is_grad_enabled() and any(t.requires_grad for t in (x, *inputs)):
                raise RuntimeError(f"{name}(..., out=...) is not differentiable, and an input requires grad: call "
                                   f"it without out=, or under torch.no_grad()")
            if not self._launch_directly((x, *inputs) if out is None else (x, *inputs, out)):
                if out is None:
                    return self._functional(x, *inputs, **scalars)
                self._out_variant(x, *inputs, out, **scalars)
                return out
        return self._kernels[name](x, *inputs, out=out, stream=stream, **scalars)

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(self.__dict__["_kernels"][self.__dict__["_name"]], attribute)

    def __repr__(self) -> str:
        return f"<operator {self._name}{self.__signature__} of instance {self._instance_name}>"


def direct_launch_check(torch):
    """A function of a call's tensors: whether the call may launch the kernel itself, unseen
    by PyTorch (plain CUDA tensors, no tracing, dispatch mode or functorch transform active,
    no gradient wanted). Looked up once: it runs on every eager call."""
    Tensor, is_compiling, grad_enabled = torch.Tensor, torch.compiler.is_compiling, torch.is_grad_enabled
    modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
    transforms = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None)
    if modes is None or transforms is None:   # a PyTorch that cannot say: always through the dispatcher
        return lambda tensors: False

    def launch_directly(tensors) -> bool:
        if is_compiling() or modes() or transforms() is not None:   # is_compiling first: Dynamo folds it
            return False
        grad = grad_enabled()
        for t in tensors:
            if type(t) is not Tensor or not t.is_cuda or (grad and t.requires_grad):   # FakeTensor, meta, host
                return False
        return True
    return launch_directly


# --- matrix multiplies: inst.matmul, inst.linear (aicg/matrix/dispatch.py) ------------------

MATRIX_OPS = ("matmul", "linear")
MATRIX_SCHEMAS = {
    "matmul": "(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None, str activation='none') -> Tensor",
    "linear": "(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor",
}
MATRIX_DOCS = {
    "matmul": "act(a @ b + bias) + residual, rounded once to the operands' type (float32 accumulation).\n"
              "a: (M, K) or (..., K); b: (K, N); bias: (N,); residual: shaped like the output (..., N); activation: "
              "None, 'gelu_tanh', 'gelu_erf' or 'silu'.",
    "linear": "x @ weight.T + bias (torch.nn.functional.linear), float32 accumulation.\n"
              "x: (..., K); weight: (N, K); bias: (N,).",
}


def _matmul_arguments(a, b, bias=None, residual=None, activation=None):
    return a, b, bias, residual, activation


def _linear_arguments(x, weight, bias=None):
    return x, weight, bias


# Each call's arguments in order, bound by a plain function of the operator's signature and name
# (inspect.Signature.bind costs microseconds a call); the tensors come first.
_matmul_arguments.__name__ = _matmul_arguments.__qualname__ = "matmul"
_linear_arguments.__name__ = _linear_arguments.__qualname__ = "linear"
MATRIX_ARGUMENTS = {"matmul": _matmul_arguments, "linear": _linear_arguments}
MATRIX_TENSORS = {"matmul": 4, "linear": 3}


def matrix_signature(name: str) -> inspect.Signature:
    """The operator's arguments, then out and stream by keyword."""
    P = inspect.Parameter
    params = list(inspect.signature(MATRIX_ARGUMENTS[name]).parameters.values())
    params += [P("out", P.KEYWORD_ONLY, default=None), P("stream", P.KEYWORD_ONLY, default=None)]
    return inspect.Signature(params)


def matrix_docstring(instance, name: str, namespace: str | None) -> str:
    classes = ", ".join(sorted(c.name for c in instance.matrix.classes.values()))
    lines = [f"{name}{matrix_signature(name)}", "", MATRIX_DOCS[name], "",
             f"This instance has kernels for: {classes} (dtype, layouts of A and B by their contiguous dimension, "
             f"epilogue); each operand's layout is read from its strides (a row-major matrix or the transpose of one).",
             "out: a contiguous array of the output's shape and dtype to write into (default: a new one); returned.",
             "stream: the CUDA stream to launch on (default: the array framework's current stream)."]
    if namespace:
        lines += ["", f"PyTorch: torch.ops.{namespace}.{name}; torch.compile traces it and CUDA graphs capture it "
                      f"(after a warm-up call at each shape). No backward: call it under torch.no_grad()."]
    return "\n".join(lines)


class MatrixOperator:
    """inst.matmul / inst.linear: the instance's matrix kernels, and their PyTorch operator."""

    def __init__(self, instance, name: str, namespace: str | None, torch_op):
        self._name, self._kernels, self._torch_op = name, instance.matrix, torch_op
        self._torch = sys.modules["torch"] if torch_op is not None else None
        self._launch_directly = direct_launch_check(self._torch) if torch_op is not None else None
        self.__name__ = self.__qualname__ = name
        self.__signature__ = matrix_signature(name)
        self.__doc__ = matrix_docstring(instance, name, namespace)

    def __call__(self, *args, out=None, stream=None, **kwargs):
        arguments = MATRIX_ARGUMENTS[self._name](*args, **kwargs)   # a TypeError names what is wrong
        tensors = [t for t in arguments[:MATRIX_TENSORS[self._name]] if t is not None]
        torch = self._torch
        if torch is not None and all(isinstance(t, torch.Tensor) for t in tensors):
            if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
                raise RuntimeError(f"{self._name} has no backward kernel or formula in this instance yet, and an "
                                   f"input requires grad: call it under torch.no_grad()")
            if out is None and stream is None and not self._launch_directly(tensors):
                if self._name == "matmul":
                    return self._torch_op(*arguments[:4], arguments[4] or "none")
                return self._torch_op(*arguments)
        return getattr(self._kernels, self._name)(*arguments, out=out, stream=stream)

    @property
    def chosen(self) -> dict:
        return self._kernels.chosen

    def __repr__(self) -> str:
        return f"<matrix operator {self._name}{self.__signature__}>"


def _matrix_out_shape(name: str, first, second) -> tuple:
    if name == "matmul":
        if second.dim() != 2 or first.dim() < 1 or first.shape[-1] != second.shape[0]:
            raise ValueError(f"b: expected shape ({first.shape[-1]}, N) for a of shape {tuple(first.shape)}, "
                             f"got {tuple(second.shape)}")
        return (*first.shape[:-1], second.shape[1])
    if second.dim() != 2 or first.dim() < 1 or first.shape[-1] != second.shape[1]:
        raise ValueError(f"weight: expected shape (N, {first.shape[-1]}) for x of shape {tuple(first.shape)}, "
                         f"got {tuple(second.shape)}")
    return (*first.shape[:-1], second.shape[0])


def _register_matrix(instance, namespace: str) -> dict:
    kernels = instance.matrix

    def run_matmul(a, b, bias=None, residual=None, activation="none"):
        return kernels.matmul(a, b, bias, residual, None if activation == "none" else activation)

    def run_linear(x, weight, bias=None):
        return kernels.linear(x, weight, bias)

    def fake_matmul(a, b, bias=None, residual=None, activation="none"):
        return a.new_empty(_matrix_out_shape("matmul", a, b))

    def fake_linear(x, weight, bias=None):
        return x.new_empty(_matrix_out_shape("linear", x, weight))

    found = {}
    for name, run, fake in (("matmul", run_matmul, fake_matmul), ("linear", run_linear, fake_linear)):
        found[name] = define(namespace, name, MATRIX_SCHEMAS[name], run, fake)
    return found


# --- PyTorch registration --------------------------------------------------------------

def define(namespace: str, name: str, schema: str, run, fake):
    """Define `namespace::name` with this schema, `run` its kernel on every device and `fake` its
    shapes for tracing; returns its OpOverload. The dispatcher calls `run` itself, where an
    operator of torch.library.custom_op passes through Python layers first (an autograd wrapper
    even with no formula, alias checks): 2 us a call against 7 on a CPU, a time each operator
    of a compiled model pays on the host."""
    import torch
    lib = _LIBRARIES.get(namespace)
    if lib is None:
        lib = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    lib.define(name + schema)
    lib.impl(name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{namespace}::{name}", fake, lib=lib)
    return getattr(getattr(torch.ops, namespace), name).default


def schema(op: Operator, out: bool = False) -> str:
    tensors = [f"Tensor {name}" for name in ("x", *op.matrices, *op.vectors)]
    if out:
        tensors.append("Tensor(a!) out")
    scalars = [f"float {name}={default!r}" for name, default in op.scalars]
    arguments = ", ".join(tensors + (["*"] + scalars if scalars else []))
    return f"({arguments}) -> " + ("()" if out else "Tensor")


def _row_layout(t):
    """`t` itself where the kernels take its layout (rows evenly apart, last dimension contiguous), else a copy."""
    if t.is_contiguous():    # most calls: no strides to read in Python
        return t
    try:
        arrays.row_stride("x", tuple(t.shape), t.stride())
        return t
    except ValueError:
        return t.contiguous()


def _checked(op: Operator, x, inputs) -> tuple:
    """The output's shape, after the checks the kernels make, raised as they raise them."""
    if x.dim() == 0:
        raise ValueError("x: expected at least one dimension (rows are the last one)")
    for name, t in zip((*op.matrices, *op.vectors), inputs):
        shape = tuple(x.shape) if name in op.matrices else (x.shape[-1],)
        if tuple(t.shape) != shape or t.dtype != x.dtype:
            raise ValueError(f"{name}: expected shape {shape} and dtype {x.dtype}, got {tuple(t.shape)} {t.dtype}")
    return tuple(x.shape) if op.output == "matrix" else tuple(x.shape[:-1])


def _register(instance, namespace: str, name: str) -> tuple:
    """Register `name` and `name_out`; returns their OpOverloads."""
    import torch
    op = OPERATORS[name]
    defaults = dict(op.scalars)
    split = len(op.matrices)

    def run(x, *inputs, **scalars):
        matrices = [_row_layout(t) for t in inputs[:split]]
        vectors = [t.contiguous() for t in inputs[split:]]
        return instance.ops[name](_row_layout(x), *matrices, *vectors, **{**defaults, **scalars})

    def fake(x, *inputs, **scalars):
        return x.new_empty(_checked(op, x, inputs))

    def run_out(x, *inputs, **scalars):
        *inputs, out = inputs
        matrices = [_row_layout(t) for t in inputs[:split]]
        vectors = [t.contiguous() for t in inputs[split:]]
        instance.ops[name](_row_layout(x), *matrices, *vectors, out=out, **{**defaults, **scalars})

    def fake_out(x, *inputs, **scalars):
        *inputs, out = inputs
        shape = _checked(op, x, inputs)
        if tuple(out.shape) != shape or out.dtype != x.dtype:
            raise ValueError(f"out: expected shape {shape} and dtype {x.dtype}, got {tuple(out.shape)} {out.dtype}")

    functional = define(namespace, name, schema(op), run, fake)
    save, backward = BACKWARD[name]

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):   # PyTorch passes the last for scalars only
        ctx.scalars = {**defaults, **(keyword_only_inputs or {})}
        ctx.shape = tuple(inputs[0].shape)
        ctx.dtypes = tuple(t.dtype for t in inputs)
        ctx.save_for_backward(*save(inputs, output))

    with_kernels = _register_backward(instance, namespace, name) if name in KERNEL_BACKWARDS else None

    def grads(ctx, grad):
        if with_kernels is not None and not torch.is_grad_enabled():   # no graph of the backward wanted
            wanted = ctx.needs_input_grad
            found = with_kernels(grad, *ctx.saved_tensors, **ctx.scalars,
                                 **({"weight_grads": any(wanted[1:])} if len(wanted) > 1 else {}))
            found = found if isinstance(found, tuple) else (found,)
            return tuple(g if need else None for g, need in zip(found, wanted))
        found = backward(grad, *ctx.saved_tensors, shape=ctx.shape, **ctx.scalars)
        return tuple(g.to(dtype) for g, dtype in zip(found, ctx.dtypes))

    torch.library.register_autograd(f"{namespace}::{name}", grads, setup_context=setup_context,
                                    lib=_LIBRARIES[namespace])
    return functional, define(namespace, f"{name}_out", schema(op, out=True), run_out, fake_out)


def backward_schema(op: Operator) -> str:
    """`<op>_backward`: the output's gradient and what the forward saved in; the gradients of x and
    (with weight_grads; empty otherwise) of the vectors out."""
    saved = KERNEL_BACKWARDS[op.name]
    tensors = ", ".join(f"Tensor {n}" for n in ("g", saved.saved, *saved.vectors))
    scalars = [f"float {name}" for name, _ in op.scalars] + (["bool weight_grads"] if op.vectors else [])
    results = ", ".join(["Tensor"] * (1 + len(op.vectors)))
    return f"({tensors}{', *, ' + ', '.join(scalars) if scalars else ''}) -> " + (f"({results})" if op.vectors else "Tensor")


def _register_backward(instance, namespace: str, name: str):
    """Register `<name>_backward`: the instance's backward kernels, PyTorch's formula where they
    decline a call (aicg/backward/runtime.py); returns its OpOverload."""
    op = OPERATORS[name]
    formula = BACKWARD[name][1]
    column_outputs = KERNEL_BACKWARDS[name].column_outputs    # w's (and b's) gradients, in w's dtype

    def run(g, saved, *vectors, weight_grads: bool = False, **scalars):
        found = instance.backward(name, g, saved, *vectors, **scalars, weight_grads=weight_grads)
        if found is None:
            wide = formula(g, saved, *vectors, shape=tuple(saved.shape), **scalars)
            found = (wide[0].to(saved.dtype), *(t.to(vectors[0].dtype) for t in wide[1:]))
        if not column_outputs:
            return found[0]
        return (found[0], *(t if weight_grads else vectors[0].new_empty(0) for t in found[1:]))

    def fake(g, saved, *vectors, weight_grads: bool = False, **scalars):
        dx = saved.new_empty(saved.shape)
        if not column_outputs:
            return dx
        cols = saved.shape[-1] if weight_grads else 0
        return (dx, *(vectors[0].new_empty(cols) for _ in column_outputs))

    return define(namespace, f"{name}_backward", backward_schema(op), run, fake)


# --- backward: PyTorch's formulas, in float32 or wider -------------------------------------
# Each operator: (what setup_context saves, from the inputs and the output; the gradients of
# x, its matrices and its vectors, in that order, from the output's gradient and what was saved).

def _wide(t):
    import torch
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _column_sum(t, cols: int):
    return t.reshape(-1, cols).sum(0)


def _softmax_backward(g, y, **_):
    g, y = _wide(g), _wide(y)
    return (y * (g - (g * y).sum(-1, keepdim=True)),)


def _log_softmax_backward(g, y, **_):
    g, y = _wide(g), _wide(y)
    return (g - y.exp() * g.sum(-1, keepdim=True),)


def _row_sum_backward(g, *, shape, **_):
    return (g.unsqueeze(-1).expand(shape),)


def _row_max_backward(g, x, y, **_):
    hits = x == y.unsqueeze(-1)   # every maximum shares the gradient, as PyTorch's amax does
    return (hits * (_wide(g) / hits.sum(-1)).unsqueeze(-1),)


def _rms_backward(g, h, w, eps):
    """(gradient of h, gradient of w) of y = h * rsqrt(mean(h^2) + eps) * w, h already wide."""
    g, w = _wide(g), _wide(w)
    inv = (h * h).mean(-1, keepdim=True).add(eps).rsqrt()
    normed = h * inv
    gn = g * w
    return inv * (gn - normed * (gn * normed).mean(-1, keepdim=True)), _column_sum(g * normed, h.shape[-1])


def _rmsnorm_backward(g, x, w, *, eps, **_):
    return _rms_backward(g, _wide(x), w, eps)


def _residual_rmsnorm_backward(g, x, r, w, *, eps, **_):
    gh, gw = _rms_backward(g, _wide(x) + _wide(r), w, eps)
    return gh, gh, gw


def _layernorm_backward(g, x, w, *, eps, **_):
    g, x, w = _wide(g), _wide(x), _wide(w)
    centred = x - x.mean(-1, keepdim=True)
    inv = (centred * centred).mean(-1, keepdim=True).add(eps).rsqrt()
    normed = centred * inv
    gn = g * w
    gx = inv * (gn - gn.mean(-1, keepdim=True) - normed * (gn * normed).mean(-1, keepdim=True))
    cols = x.shape[-1]
    return gx, _column_sum(g * normed, cols), _column_sum(g, cols)


def _bias_gelu_residual_backward(g, x, b, **_):
    g = _wide(g)
    z = _wide(x) + _wide(b)
    slope = 0.5 * (1 + (z / math.sqrt(2)).erf()) + z * (-0.5 * z * z).exp() / math.sqrt(2 * math.pi)
    gz = g * slope
    return gz, g, _column_sum(gz, z.shape[-1])


BACKWARD = {
    "softmax": (lambda inputs, y: (y,), _softmax_backward),
    "log_softmax": (lambda inputs, y: (y,), _log_softmax_backward),
    "row_sum": (lambda inputs, y: (), _row_sum_backward),
    "row_max": (lambda inputs, y: (inputs[0], y), _row_max_backward),
    "rmsnorm": (lambda inputs, y: inputs, _rmsnorm_backward),
    "layernorm": (lambda inputs, y: inputs[:2], _layernorm_backward),
    "bias_gelu_residual": (lambda inputs, y: (inputs[0], inputs[2]), _bias_gelu_residual_backward),
    "residual_rmsnorm": (lambda inputs, y: inputs, _residual_rmsnorm_backward),
}
