"""Wrong matrix kernels made from the right ones: the real templates with one edit each, for the
adversarial suite (tests/test_gpu_matrix_adversarial.py) to show that validation rejects them.

Each mutant names the realisation it starts from and the textual edits of one file: the generated
source or a header it includes; `sources` applies them (failing loudly where the text is no longer
there, so a template change cannot turn a mutant into the right kernel unnoticed) and compiles it
with NVRTC as the build would.
"""
from __future__ import annotations

from dataclasses import dataclass

from aicg.matrix import build, codegen, space
from aicg.matrix.space import Epilogue

FUSED = Epilogue("gelu_erf", bias=True, residual=True)


@dataclass(frozen=True)
class Mutant:
    name: str
    template: str
    epilogue: Epilogue
    where: str                          # "source" or a header's name under kernels/
    edits: tuple[tuple[str, str], ...]  # (old text, new text), each applied in turn

    def realisation(self) -> space.Realisation:
        return space.realisation(self.template, "bfloat16", "k", "k", self.epilogue,
                                 **space.templates()[self.template].tried[0])


# A counter of the kernel's launches, read at its start: from the third launch on it returns at
# once and leaves whatever the output holds (a result from before, or the poison).
STALE = (('extern "C" __global__', '__device__ unsigned aicg_launches;\nextern "C" __global__'),
         ("{\n  aicg::matrix::", "{\n  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) "
                                 "atomicAdd(&aicg_launches, 1u);\n  if (*(volatile unsigned*)&aicg_launches > 2) "
                                 "return;\n  aicg::matrix::"))

MUTANTS = (
    Mutant("skips a k tile", "wgmma", Epilogue(), "matrix/gemm_wgmma.cuh",
           (("Wgmma<BN, T, A_MAJOR, B_MAJOR>::mma(acc[atom],",
             "if (kb != kb0 + 1) Wgmma<BN, T, A_MAJOR, B_MAJOR>::mma(acc[atom],"),)),
    Mutant("reads B transposed", "wgmma", Epilogue(), "source",
           (("aicg::matrix::K_MAJOR, aicg::matrix::K_MAJOR,", "aicg::matrix::K_MAJOR, aicg::matrix::MN_MAJOR,"),)),
    Mutant("applies GELU twice", "wgmma", FUSED, "matrix/epilogue.cuh",
           (("return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));",
             "x = 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));\n"
             "    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));"),)),
    # both stores: the pair of 16-bit results written as one word (aligned outputs, the problems
    # below) and one result at a time
    Mutant("leaves the bias out of even columns", "gemv", Epilogue(bias=True), "matrix/epilogue.cuh",
           (("b0 = half_of(bias_word, 0, T{});", "b0 = 0.0f;"), ("b0 = to_float(bias[col]);", "b0 = 0.0f;"))),
    Mutant("keeps a previous result", "wgmma", Epilogue(), "source", STALE),
)


def _edited(text: str, mutant: Mutant) -> str:
    for old, new in mutant.edits:
        if old not in text:
            raise AssertionError(f"{mutant.name}: {old!r} is not in {mutant.where} any more")
        text = text.replace(old, new)
    return text


def sources(mutant: Mutant) -> tuple[str, dict[str, bytes]]:
    """The mutant's generated source and the headers it includes, one of them edited."""
    real = mutant.realisation()
    src, headers = codegen.source(real), dict(build.headers(real))
    if mutant.where == "source":
        src = _edited(src, mutant)
    else:
        headers[mutant.where] = _edited(headers[mutant.where].decode(), mutant).encode()
    return src, headers


def compile_mutant(mutant: Mutant, arch: str) -> build.Built:
    src, headers = sources(mutant)
    return build.compile_source(mutant.realisation(), src, f"mutant-{mutant.template}.cu", headers, arch)
