"""The matrix family's parameter space: templates, realisations, epilogues.

A *realisation* is one instantiation of a template (kernels/matrix/*.cuh):
its element type, the layout of each operand, the epilogue, and the
template's knobs (tile shape, stages, cluster, raster order...). The knob
domains and the settings tried first are data (space.toml); what makes a
point illegal on a GPU is each template's own rule (aicg/matrix/templates/).

Layouts name the operand's contiguous dimension, as the wgmma ISA does:
  A "k":  M x K row-major (K contiguous)      A "mn": K x M row-major (column-major A)
  B "k":  N x K row-major (F.linear's weight) B "mn": K x N row-major (torch.matmul's b)
C, bias (N) and residual (M x N) are row-major.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

from .. import tomlfile

SPACE_FILE = Path(__file__).with_name("space.toml")
DTYPES = ("bfloat16", "float16")
LAYOUTS = ("k", "mn")
ACTIVATIONS = ("none", "gelu_tanh", "gelu_erf", "silu")


@dataclass(frozen=True)
class Epilogue:
    """What joins the accumulator on its way out: + bias[col], an activation, + residual[row, col]."""
    activation: str = "none"
    bias: bool = False
    residual: bool = False

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: expected one of {', '.join(ACTIVATIONS)}")

    @property
    def name(self) -> str:
        parts = (["bias"] if self.bias else []) + ([self.activation] if self.activation != "none" else []) + \
                (["residual"] if self.residual else [])
        return "+".join(parts) or "plain"

    def as_dict(self) -> dict:
        return {"activation": self.activation, "bias": self.bias, "residual": self.residual}


@dataclass(frozen=True)
class Template:
    name: str
    header: str                         # under kernels/
    function: str                       # the device function the entry calls
    compute_capability: tuple[int, int] # the least it needs, or exactly this where `exact`
    exact: bool
    a_layouts: tuple[str, ...]
    b_layouts: tuple[str, ...]
    knobs: dict = field(hash=False)     # name -> tuple of allowed values
    tried: tuple = field(hash=False)    # knob settings (dicts) ranked first
    # knobs added after realisations were recorded and named -> the value those realisations had:
    # a record without the knob reads as that value, and a name leaves that value out
    earlier: dict = field(hash=False, default_factory=dict)

    def runs_on(self, compute_capability: tuple[int, int]) -> bool:
        cc = tuple(compute_capability)
        return cc == self.compute_capability if self.exact else cc >= self.compute_capability


@dataclass(frozen=True)
class Realisation:
    template: str
    dtype: str
    a_major: str
    b_major: str
    epilogue: Epilogue
    knobs: tuple            # sorted (name, value) pairs

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: the matrix family takes {', '.join(DTYPES)}")
        for layout in (self.a_major, self.b_major):
            if layout not in LAYOUTS:
                raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")

    def knob(self, name: str):
        return dict(self.knobs)[name]

    @property
    def settings(self) -> dict:
        return dict(self.knobs)

    @property
    def name(self) -> str:
        """A readable unique id: template, dtype, layouts (A then B), knobs, epilogue."""
        earlier = templates()[self.template].earlier
        knobs = "_".join(f"{ABBREVIATIONS.get(k, k)}{_short(v)}" for k, v in self.knobs
                         if k not in earlier or earlier[k] != v)
        dtype = {"bfloat16": "bf16", "float16": "f16"}[self.dtype]
        return f"{self.template}.{dtype}.{self.a_major}{self.b_major}.{knobs}.{self.epilogue.name}"

    def as_dict(self) -> dict:
        return {"template": self.template, "dtype": self.dtype, "a_major": self.a_major, "b_major": self.b_major,
                "epilogue": self.epilogue.as_dict(), "knobs": dict(self.knobs)}

    @staticmethod
    def from_dict(d: dict) -> "Realisation":
        """A recorded realisation (one from before a knob of [earlier] existed lacks it)."""
        return realisation(d["template"], d["dtype"], d["a_major"], d["b_major"], Epilogue(**d["epilogue"]),
                           **d["knobs"])


# Knob names as realisation names spell them (a word-valued knob needs none: its value says it).
ABBREVIATIONS = {"block_m": "bm", "block_n": "bn", "block_k": "bk", "stages": "s", "cluster_m": "c", "cluster_n": "cn", "raster": "r",
                 "group": "g", "warps_m": "wm", "warps_n": "wn", "aligned": "al", "warps": "w", "tiles": "t",
                 "unroll": "u", "schedule": "", "store": "", "split_k": "k", "ring": "rg", "spread": ""}
VALUE_ABBREVIATIONS = {"cooperative": "coop"}


def _short(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return VALUE_ABBREVIATIONS.get(value, str(value)) if isinstance(value, str) else str(value)


def realisation(template: str, dtype: str, a_major: str, b_major: str, epilogue: Epilogue = Epilogue(),
                **knobs) -> Realisation:
    """A realisation of `template`, its knobs checked against the template's domains (a knob of
    the template's [earlier] table may be left out: it takes its earlier value)."""
    tpl = templates()[template]
    knobs = {**tpl.earlier, **knobs}
    missing = sorted(set(tpl.knobs) - set(knobs))
    unknown = sorted(set(knobs) - set(tpl.knobs))
    if missing or unknown:
        raise ValueError(f"{template} knobs: missing {missing}, unknown {unknown}")
    for name, value in knobs.items():
        if value not in tpl.knobs[name] or type(value) is not type(tpl.knobs[name][0]):
            raise ValueError(f"{template} knob {name} = {value!r}: expected one of {list(tpl.knobs[name])}")
    if a_major not in tpl.a_layouts or b_major not in tpl.b_layouts:
        raise ValueError(f"{template} takes A layouts {tpl.a_layouts} and B layouts {tpl.b_layouts}, "
                         f"not A {a_major!r}, B {b_major!r}")
    return Realisation(template, dtype, a_major, b_major, epilogue, tuple(sorted(knobs.items())))


@functools.cache
def templates(path: Path = SPACE_FILE) -> dict[str, Template]:
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    found = {}
    for name, table in doc.table("templates").tables():
        cc = table.get("compute_capability", list, item=int)
        if len(cc) != 2:
            raise table.error("compute_capability", "[major, minor]", cc)
        knobs_table = table.table("knobs")
        knobs = {}
        for knob in knobs_table.keys():
            values = knobs_table.get(knob, list)
            if not values or len({type(v) for v in values}) != 1:
                raise knobs_table.error(knob, "a non-empty array of values of one type", values)
            knobs[knob] = tuple(values)
        knobs_table.done()
        earlier_table, earlier = table.table("earlier", default={}), {}
        for knob in earlier_table.keys():
            if knob not in knobs:
                raise earlier_table.error(knob, f"a knob of the template ({', '.join(knobs)})", knob)
            earlier[knob] = earlier_table.get(knob, type(knobs[knob][0]), choices=set(knobs[knob]))
        earlier_table.done()
        tried = []
        for i, setting in enumerate(table.get("tried", list, default=[])):
            # a knob added later may be left out: the settings tried before it keep its earlier value
            setting = {**earlier, **setting} if isinstance(setting, dict) else setting
            if not isinstance(setting, dict) or set(setting) != set(knobs) or \
                    any(setting[k] not in knobs[k] for k in knobs):
                raise table.error(f"tried[{i}]", f"a value for each knob ({', '.join(knobs)}) from its domain "
                                  f"(those of [earlier] may be left out)", setting)
            tried.append(setting)
        found[name] = Template(name, table.get("header", str), table.get("function", str), (cc[0], cc[1]),
                               table.get("exact_compute_capability", bool),
                               tuple(table.get("a_layouts", list, item=str)),
                               tuple(table.get("b_layouts", list, item=str)), knobs, tuple(tried), earlier)
        table.done()
    doc.done()
    return found


def knob_settings(template: str):
    """Every combination of the template's knob values (before any constraint), as dicts."""
    tpl = templates()[template]
    names = sorted(tpl.knobs)
    for values in product(*(tpl.knobs[n] for n in names)):
        yield dict(zip(names, values))
