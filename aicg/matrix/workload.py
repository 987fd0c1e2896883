"""A profile's matrix multiplies: `[[matmul]]` entries, read strictly.

    [[matmul]]
    dtypes = ["bfloat16"]                  # bfloat16 and/or float16 (float32 accumulation)
    a_major = "k"                          # optional, "k" (M x K row-major, the default) or "mn"
    b_major = "k"                          # optional, "k" (N x K: F.linear's weight, the default) or "mn" (K x N)
    epilogue = { bias = true, activation = "gelu_erf", residual = true }   # optional, each key optional
    shapes = [[8192, 4096, 4096]]          # [M, N, K]

Entries of the same dtype, layouts and epilogue form one *class*: the calls
one set of realisations computes (aicg/matrix/space.py's Realisation fixes
all four). Their shapes are merged in the order first seen.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import tomlfile
from .space import ACTIVATIONS, DTYPES, LAYOUTS, Epilogue

KEY = "matmul"
MAX_SHAPES_PER_CLASS = 64       # every candidate is predicted, validated and timed at each
MAX_DIMENSION = 2**31 - 1       # the kernels index rows and columns with int
ELEMENT_BYTES = 2


@dataclass(frozen=True)
class MatmulClass:
    dtype: str
    a_major: str
    b_major: str
    epilogue: Epilogue
    shapes: tuple[tuple[int, int, int], ...]    # (M, N, K)
    where: str = ""                             # the profile key that first named it, for errors

    @property
    def name(self) -> str:
        return f"{KEY}.{self.dtype}.{self.a_major}{self.b_major}.{self.epilogue.name}"

    def as_record(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "a_major": self.a_major, "b_major": self.b_major,
                "epilogue": self.epilogue.as_dict(), "shapes": [list(s) for s in self.shapes]}


def shape_bytes(shape: tuple[int, int, int], epilogue: Epilogue) -> int:
    """The bytes of A, B, C (and bias, residual) of one call."""
    m, n, k = shape
    return ELEMENT_BYTES * (m * k + k * n + m * n * (1 + epilogue.residual) + n * epilogue.bias)


def _epilogue(t: tomlfile.Table) -> Epilogue:
    e = t.table("epilogue", default={})
    found = Epilogue(e.get("activation", str, default="none", choices=set(ACTIVATIONS)),
                     e.get("bias", bool, default=False), e.get("residual", bool, default=False))
    e.done()
    return found


def _shapes(t: tomlfile.Table) -> list[tuple[int, int, int]]:
    shapes = t.get("shapes", list, item=list)
    if not shapes:
        raise t.error("shapes", "at least one [M, N, K] triple", shapes)
    for shape in shapes:
        if len(shape) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_DIMENSION
                                      for n in shape):
            raise t.error("shapes", f"[M, N, K] triples of positive integers of at most {MAX_DIMENSION} "
                                    "(the kernels index rows and columns with int)", shape)
    return [tuple(s) for s in shapes]


def read(doc: tomlfile.Table, dram_capacity: float, target: str) -> tuple[MatmulClass, ...]:
    """The profile's matrix classes (none where it has no [[matmul]] entry)."""
    entries = doc.get(KEY, list, default=[], item=dict)
    merged: dict[tuple, tuple[dict, str]] = {}
    for i, entry in enumerate(entries):
        t = tomlfile.Table(doc.file, entry, f"{KEY}[{i}]")
        dtypes = t.get("dtypes", list, item=str, choices=set(DTYPES))
        if not dtypes:
            raise t.error("dtypes", "at least one of " + ", ".join(DTYPES), dtypes)
        a_major = t.get("a_major", str, default="k", choices=set(LAYOUTS))
        b_major = t.get("b_major", str, default="k", choices=set(LAYOUTS))
        epilogue = _epilogue(t)
        shapes = _shapes(t)
        t.done()
        for shape in shapes:
            need = shape_bytes(shape, epilogue)
            if need > dram_capacity:
                raise t.error("shapes", f"shapes whose operands fit the memory of {target} "
                                        f"({dram_capacity / 2**30:.1f} GiB): {shape[0]} x {shape[1]} x {shape[2]} "
                                        f"needs {need / 2**30:.1f} GiB", list(shape))
        for dtype in dict.fromkeys(dtypes):
            key = (dtype, a_major, b_major, epilogue)
            found, where = merged.setdefault(key, ({}, f"{KEY}[{i}]"))
            found.update(dict.fromkeys(shapes))
            if len(found) > MAX_SHAPES_PER_CLASS:
                raise t.error("shapes", f"at most {MAX_SHAPES_PER_CLASS} distinct shapes per dtype, layouts and "
                                        f"epilogue (every candidate is validated and timed at each)",
                              f"more than {MAX_SHAPES_PER_CLASS} for {dtype} {a_major}{b_major} {epilogue.name}")
    return tuple(MatmulClass(dtype, a, b, e, tuple(shapes), where)
                 for (dtype, a, b, e), (shapes, where) in merged.items())
