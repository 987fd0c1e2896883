"""Codegen: a matrix realisation becomes a small, complete CUDA source.

As for the row families (aicg/codegen.py), the source includes the
template's header and defines one extern "C" entry, `aicg_matmul`, whose
body instantiates the template with the realisation's arguments. Nothing
else is written here: the algorithm lives in kernels/matrix/, and a compiler
error points at the header's own file and line.
"""
from __future__ import annotations

from .space import Realisation, templates
from .templates import RULES
from .templates.base import CTYPES

ENTRY = "aicg_matmul"


def source(real: Realisation) -> str:
    tpl, rules = templates()[real.template], RULES[real.template]
    ctype = CTYPES[real.dtype]
    min_blocks = rules.min_blocks(real)
    bounds = f"{rules.threads(real)}" + (f", {min_blocks}" if min_blocks else "")
    knobs = " ".join(f"{k}={v}" for k, v in real.knobs)
    signature = ",\n    ".join(rules.parameters(ctype))
    return (
        f"// aicg matrix realisation {real.name}\n"
        f"// template {tpl.name} ({tpl.header}), {real.dtype}, A {real.a_major}-major, B {real.b_major}-major, "
        f"epilogue {real.epilogue.name}, {knobs}\n"
        f'#include "{tpl.header}"\n'
        f"\n"
        f'extern "C" __global__ void __launch_bounds__({bounds})\n'
        f"{ENTRY}(\n    {signature}) {{\n"
        f"  {tpl.function}<{', '.join(rules.template_arguments(real))}>({', '.join(rules.call_arguments())});\n"
        f"}}\n"
    )
