"""One matrix multiply to run: shapes, layouts, leading dimensions, epilogue.

C[M, N] = epilogue(A[M, K] B[K, N]). Each operand is stored row-major with a
leading dimension (elements between row starts) of at least its row length:

  A "k":  M rows of K (lda >= K)     A "mn": K rows of M (lda >= M)
  B "k":  N rows of K (ldb >= K)     B "mn": K rows of N (ldb >= N)
  C:      M rows of N (ldc >= N)     residual: M rows of N (ldr >= N); bias: N

Bad arguments raise ValueError naming the argument and what it must be.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .space import DTYPES, LAYOUTS, Epilogue

MAX_DIMENSION = 2**31 - 1     # the kernels index rows and columns with int


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    a_major: str = "k"
    b_major: str = "k"
    epilogue: Epilogue = field(default_factory=Epilogue)
    lda: int = 0      # 0: the row length (tightly packed)
    ldb: int = 0
    ldc: int = 0
    ldr: int = 0

    def __post_init__(self):
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIMENSION:
                raise ValueError(f"{name} = {value!r}: expected an integer from 1 to {MAX_DIMENSION}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype = {self.dtype!r}: expected one of {', '.join(DTYPES)}")
        for name in ("a_major", "b_major"):
            if getattr(self, name) not in LAYOUTS:
                raise ValueError(f"{name} = {getattr(self, name)!r}: expected one of {', '.join(LAYOUTS)}")
        if not isinstance(self.epilogue, Epilogue):
            raise ValueError(f"epilogue = {self.epilogue!r}: expected an aicg.matrix.space.Epilogue")
        for name, row in (("lda", self.a_stored[1]), ("ldb", self.b_stored[1]), ("ldc", self.n), ("ldr", self.n)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} = {value!r}: expected a non-negative integer")
            if value == 0:
                object.__setattr__(self, name, row)
            elif value < row:
                raise ValueError(f"{name} = {value}: a row of {row} elements needs a leading dimension of at least {row}")

    @property
    def a_stored(self) -> tuple[int, int]:
        """(rows, row length) of A as stored."""
        return (self.m, self.k) if self.a_major == "k" else (self.k, self.m)

    @property
    def b_stored(self) -> tuple[int, int]:
        return (self.n, self.k) if self.b_major == "k" else (self.k, self.n)

    def elements(self, operand: str) -> int:
        """Elements an operand's allocation spans (rows - 1 leading dimensions plus a row)."""
        rows, row, ld = {"a": (*self.a_stored, self.lda), "b": (*self.b_stored, self.ldb),
                         "c": (self.m, self.n, self.ldc), "residual": (self.m, self.n, self.ldr),
                         "bias": (1, self.n, self.n)}[operand]
        return (rows - 1) * ld + row

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def with_shape(self, m: int, n: int, k: int) -> "Problem":
        """The same layouts and epilogue at another shape, tightly packed."""
        return replace(self, m=m, n=n, k=k, lda=0, ldb=0, ldc=0, ldr=0)

    @property
    def name(self) -> str:
        lds = "" if (self.lda, self.ldb, self.ldc, self.ldr) == (self.a_stored[1], self.b_stored[1], self.n, self.n) \
            else f" ld{self.lda},{self.ldb},{self.ldc},{self.ldr}"
        return f"{self.m}x{self.n}x{self.k} {self.dtype} {self.a_major}{self.b_major} {self.epilogue.name}{lds}"

    def as_dict(self) -> dict:
        return {"m": self.m, "n": self.n, "k": self.k, "dtype": self.dtype, "a_major": self.a_major,
                "b_major": self.b_major, "epilogue": self.epilogue.as_dict(), "lda": self.lda, "ldb": self.ldb,
                "ldc": self.ldc, "ldr": self.ldr}

    @staticmethod
    def from_dict(d: dict) -> "Problem":
        return Problem(**{**d, "epilogue": Epilogue(**d["epilogue"])})
