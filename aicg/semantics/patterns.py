"""Loading rulesets/patterns.toml: the graph patterns an instance operator may replace.

Three tables. `operations` says how a captured PyTorch graph spells each operation a
pattern names: a canonical signature, the callables that compute it, and their own
signatures where those differ. `patterns` says, per instance operator, which expressions
over those operations it computes, and which rules (rules.toml) must be legal for its
kernel to stand there. `matrix_patterns` says which expressions the instance's matrix
kernels compute (inst.matmul with an epilogue): F.linear's x, weight and bias, an
activation and a residual. Expressions are written in Python syntax and parsed with `ast`
into the small tree below; everything a pattern names (operations, their arguments, the
operator's arguments, rules, where-names) is checked here, so a typo is an InputError
naming the file and key, not a pattern that silently never matches.

This module needs no PyTorch: it reads and checks data. aicg/fx resolves the callables
and matches the patterns on graphs.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from .. import tomlfile
from ..dtypes import DTYPES
from ..ops import OPERATORS

DTYPE_NAMES = frozenset(DTYPES) | {"float64"}   # names that stand for a torch dtype
ANY = "_"
_CALLABLE = re.compile(r"^(Tensor\.[A-Za-z_]\w*|[A-Za-z_]\w*(\.[A-Za-z_]\w*)+)$")


# --- expressions -----------------------------------------------------------------------

@dataclass(frozen=True)
class Literal:
    """A constant: a number, a string, True/False/None, or a tuple of them."""
    value: object


@dataclass(frozen=True)
class Dtype:
    name: str


@dataclass(frozen=True)
class Anything:
    pass


@dataclass(frozen=True)
class Capture:
    """An argument of the instance operator: what the graph passes here becomes that argument."""
    name: str


@dataclass(frozen=True)
class Named:
    """A where-name: its expression, matched once, the same value at every use."""
    name: str


@dataclass(frozen=True)
class Call:
    operation: str
    arguments: tuple[tuple[str, object], ...]   # (parameter, expression): those the pattern gives

    def given(self) -> dict[str, object]:
        return dict(self.arguments)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()   # the default of a parameter without one


@dataclass(frozen=True)
class Parameter:
    name: str
    default: object = REQUIRED        # an expression (Literal or Dtype), or REQUIRED
    keyword_only: bool = False


@dataclass(frozen=True)
class Signature:
    parameters: tuple[Parameter, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def positional(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters if not p.keyword_only)

    def bind(self, args, kwargs: dict) -> dict | None:
        """Argument name -> value (defaults left out), or None where these arguments do not fit."""
        positional = self.positional()
        if len(args) > len(positional):
            return None
        bound = dict(zip(positional, args))
        names = set(self.names())
        for key, value in kwargs.items():
            if key not in names or key in bound:
                return None
            bound[key] = value
        if any(p.default is REQUIRED and p.name not in bound for p in self.parameters):
            return None
        return bound


@dataclass(frozen=True)
class Operation:
    name: str
    signature: Signature
    spellings: dict[str, Signature]   # callable ("torch.softmax", "Tensor.softmax", "operator.add") -> its signature
    dims: tuple[str, ...]
    commutative: bool


@dataclass(frozen=True)
class Pattern:
    name: str
    operator: str
    match: Call
    where: dict[str, object]          # where-name -> expression
    rules: tuple[str, ...]
    why: str
    size: int                         # operations matched (a where-name's once)
    activation: str | None = None     # a matrix pattern's (MATRIX_OPERATOR): the epilogue's activation

    @property
    def is_matrix(self) -> bool:
        return self.operator == MATRIX_OPERATOR


# A matrix pattern's operator, and what it binds: x (the rows, K wide), w (F.linear's weight,
# N x K), b (its bias, N) and r (a residual added last, shaped like the result); x and w always.
MATRIX_OPERATOR = "matmul"
MATRIX_CAPTURES = ("x", "w", "b", "r")
MATRIX_ACTIVATIONS = ("none", "gelu_erf", "gelu_tanh", "silu")


@dataclass(frozen=True)
class Patterns:
    path: Path
    operations: dict[str, Operation]
    patterns: tuple[Pattern, ...]     # in the order they are tried: more operations first

    def for_operator(self, operator: str) -> list[Pattern]:
        return [p for p in self.patterns if p.operator == operator]


# --- reading -----------------------------------------------------------------------------

def _constant(node: ast.AST):
    """The value of a constant expression (numbers, strings, True/False/None, -n, tuples), or raise ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    if isinstance(node, ast.Tuple):
        return tuple(_constant(e) for e in node.elts)
    raise ValueError(ast.unparse(node))


def _default(table: tomlfile.Table, key: str, node: ast.AST):
    if isinstance(node, ast.Name) and node.id in DTYPE_NAMES:
        return Dtype(node.id)
    try:
        return Literal(_constant(node))
    except ValueError:
        raise table.error(key, "defaults that are constants or dtype names", ast.unparse(node)) from None


def parse_signature(table: tomlfile.Table, key: str, text: str) -> Signature:
    """`(input, dim, *, dtype=None)`: positional-or-keyword and keyword-only parameters with constant defaults."""
    try:
        tree = ast.parse(f"def _{text}: pass", mode="exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise table.error(key, "a signature in Python syntax, such as \"(input, dim, dtype=None)\"", text) from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise table.error(key, "a signature in Python syntax, such as \"(input, dim, dtype=None)\"", text)
    args = tree.body[0].args
    if args.vararg or args.kwarg or args.posonlyargs:
        raise table.error(key, "named parameters only (no *args, **kwargs or /)", text)
    if not (args.args or args.kwonlyargs):
        raise table.error(key, "at least one parameter (the input)", text)
    plain = args.args
    first_default = len(plain) - len(args.defaults)
    parameters = [Parameter(a.arg, REQUIRED if i < first_default else _default(table, key, args.defaults[i - first_default]))
                  for i, a in enumerate(plain)]
    parameters += [Parameter(a.arg, REQUIRED if d is None else _default(table, key, d), keyword_only=True)
                   for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return Signature(tuple(parameters))


def _operation(name: str, t: tomlfile.Table) -> Operation:
    signature = parse_signature(t, "signature", t.get("signature", str))
    callables = t.get("callables", list, item=str)
    if not callables:
        raise t.error("callables", "at least one function, method (\"Tensor.<name>\") or operator")
    for spelling in callables:
        if not _CALLABLE.match(spelling):
            raise t.error("callables", "import paths (\"torch.softmax\", \"operator.add\") or methods "
                                       "(\"Tensor.softmax\")", spelling)
    own = t.table("signatures", default={})
    spellings = {spelling: signature for spelling in callables}
    for spelling in own.keys():
        if spelling not in spellings:
            raise own.error(spelling, f"one of this operation's callables ({', '.join(callables)})")
        theirs = parse_signature(own, spelling, own.get(spelling, str))
        given = set(theirs.names())
        missing = [p.name for p in signature.parameters if p.default is REQUIRED
                   and not any(q.name == p.name for q in theirs.parameters)]
        if missing:
            raise own.error(spelling, f"a signature with every parameter of {name} that has no default "
                                      f"({', '.join(missing)}), or a default for it", own.get(spelling, str))
        if not given & set(signature.names()):
            raise own.error(spelling, f"a signature sharing parameters with {name}'s", own.get(spelling, str))
        spellings[spelling] = theirs
    own.done()
    dims = tuple(t.get("dims", list, default=[], item=str, choices=set(signature.names())))
    commutative = t.get("commutative", bool, default=False)
    if commutative and len(signature.positional()) < 2:
        raise t.error("commutative", "false for an operation of fewer than two positional parameters", commutative)
    t.done()
    return Operation(name, signature, spellings, dims, commutative)


class _Reader:
    """Turns one pattern's Python expressions into the tree above, checking every name."""

    def __init__(self, t: tomlfile.Table, key: str, operations: dict[str, Operation], captures: tuple[str, ...],
                 where_names: set[str]):
        self.t, self.key, self.operations = t, key, operations
        self.captures, self.where_names = captures, where_names
        self.used: set[str] = set()

    def error(self, expected: str, found):
        return self.t.error(self.key, expected, found)

    def parse(self, text: str):
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as err:
            raise self.error(f"an expression in Python syntax ({err.msg})", text) from None
        except (ValueError, RecursionError, MemoryError):   # a NUL byte; nesting past the parser's depth
            raise self.error("an expression in Python syntax, nested a few levels deep", text[:200]) from None
        try:
            return self.expression(tree.body)
        except RecursionError:
            raise self.error("an expression nested a few levels deep", text[:200]) from None

    def expression(self, node: ast.AST):
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Name):
            self.used.add(node.id)
            if node.id == ANY:
                return Anything()
            if node.id in self.captures:
                return Capture(node.id)
            if node.id in self.where_names:
                return Named(node.id)
            if node.id in DTYPE_NAMES:
                return Dtype(node.id)
            raise self.error(f"names that are the operator's arguments ({', '.join(self.captures)}), where-names, "
                             f"dtypes or _", node.id)
        try:
            return Literal(_constant(node))
        except ValueError:
            raise self.error("operation calls, names and constants", ast.unparse(node)) from None

    def call(self, node: ast.Call) -> Call:
        if not isinstance(node.func, ast.Name) or node.func.id not in self.operations:
            raise self.error(f"calls of operations defined in [operations] ({', '.join(sorted(self.operations))})",
                             ast.unparse(node.func))
        operation = self.operations[node.func.id]
        signature = operation.signature
        positional = signature.positional()
        if len(node.args) > len(positional) or any(isinstance(a, ast.Starred) for a in node.args):
            raise self.error(f"at most {len(positional)} positional arguments to {operation.name}{_render(signature)}",
                             ast.unparse(node))
        given = dict(zip(positional, node.args))
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg not in signature.names() or keyword.arg in given:
                raise self.error(f"arguments of {operation.name}{_render(signature)}, each once", ast.unparse(node))
            given[keyword.arg] = keyword.value
        missing = [p.name for p in signature.parameters if p.default is REQUIRED and p.name not in given]
        if missing:
            raise self.error(f"a value (or _) for {operation.name}'s {', '.join(missing)}", ast.unparse(node))
        if positional[0] not in given:
            raise self.error(f"{operation.name}'s first argument", ast.unparse(node))
        return Call(operation.name, tuple((name, self.expression(value)) for name, value in given.items()))


def _render(signature: Signature) -> str:
    parts, starred = [], False
    for p in signature.parameters:
        if p.keyword_only and not starred:
            parts.append("*")
            starred = True
        parts.append(p.name if p.default is REQUIRED else f"{p.name}=...")
    return "(" + ", ".join(parts) + ")"


def _calls(expression, where: dict, seen: set[str]) -> int:
    """Operations in an expression, a where-name's counted at its first use only."""
    if isinstance(expression, Call):
        return 1 + sum(_calls(e, where, seen) for _, e in expression.arguments)
    if isinstance(expression, Named) and expression.name not in seen:
        seen.add(expression.name)
        return _calls(where[expression.name], where, seen)
    return 0


def _named_in(expression) -> set[str]:
    if isinstance(expression, Call):
        return set().union(*(_named_in(e) for _, e in expression.arguments))
    return {expression.name} if isinstance(expression, Named) else set()


def _pattern(name: str, t: tomlfile.Table, operations: dict[str, Operation], rule_names: set[str]) -> Pattern:
    operator = OPERATORS[t.get("operator", str, choices=set(OPERATORS))]
    captures = ("x", *operator.matrices, *operator.vectors, *(s for s, _ in operator.scalars))
    where_table = t.table("where", default={})
    where_names = set(where_table.keys())
    clash = sorted(where_names & (set(captures) | set(operations) | DTYPE_NAMES | {ANY}))
    if clash:
        raise where_table.error(clash[0], "a name that is not an operation, an operator argument, a dtype or _")
    where, used = {}, set()
    for where_name in sorted(where_names):
        reader = _Reader(where_table, where_name, operations, captures, where_names)
        where[where_name] = reader.parse(where_table.get(where_name, str))
        used |= reader.used
    where_table.done()
    reader = _Reader(t, "match", operations, captures, where_names)
    match = reader.parse(t.get("match", str))
    used |= reader.used
    if not isinstance(match, Call):
        raise t.error("match", "an expression whose outermost part is an operation call", t.get("match", str))
    _check_where_graph(t, match, where)
    missing = [c for c in captures if c not in used]
    if missing:
        raise t.error("match", f"an expression that binds every argument of {operator.name} "
                               f"({', '.join(captures)}); it does not bind {', '.join(missing)}", t.get("match", str))
    unused = sorted(where_names - used)
    if unused:
        raise t.error(f"where.{unused[0]}", "a name the pattern uses")
    rules = tuple(t.get("rules", list, default=[], item=str, choices=rule_names))
    why = t.get("why", str, default="")
    if rules and not why:
        raise t.error("why", "a sentence saying why the kernel needs these rules here (rules is not empty)")
    t.done()
    return Pattern(name, operator.name, match, where, rules, why, _calls(match, where, set()))


def _matrix_pattern(name: str, t: tomlfile.Table, operations: dict[str, Operation]) -> Pattern:
    reader = _Reader(t, "match", operations, MATRIX_CAPTURES, set())
    match = reader.parse(t.get("match", str))
    if not isinstance(match, Call):
        raise t.error("match", "an expression whose outermost part is an operation call", t.get("match", str))
    missing = [c for c in ("x", "w") if c not in reader.used]
    if missing:
        raise t.error("match", f"an expression that binds x and w (and b, r where it has a bias, a residual); it "
                               f"does not bind {', '.join(missing)}", t.get("match", str))
    activation = t.get("activation", str, default="none", choices=set(MATRIX_ACTIVATIONS))
    why = t.get("why", str, default="")
    t.done()
    return Pattern(name, MATRIX_OPERATOR, match, {}, (), why, _calls(match, {}, set()), activation)


def matrix_epilogue(pattern: Pattern) -> tuple[str, bool, bool]:
    """(activation, bias, residual) of a matrix pattern: what its match binds."""
    bound = _captured(pattern.match)
    return pattern.activation or "none", "b" in bound, "r" in bound


def _captured(expression) -> set[str]:
    if isinstance(expression, Call):
        return set().union(*(_captured(e) for _, e in expression.arguments))
    return {expression.name} if isinstance(expression, Capture) else set()


def _check_where_graph(t: tomlfile.Table, match: Call, where: dict) -> None:
    """Where-names may use each other, but not in a cycle."""
    state: dict[str, str] = {}

    def visit(name: str) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            raise t.error(f"where.{name}", "expressions that do not use themselves, directly or through others")
        state[name] = "open"
        for inner in sorted(_named_in(where[name])):
            visit(inner)
        state[name] = "done"

    for name in sorted(where):
        visit(name)


def load(path: Path, rule_names) -> Patterns:
    """rulesets/patterns.toml; `rule_names`: the rules a pattern may need (those of rules.toml)."""
    path = Path(path)
    doc = tomlfile.read(path)
    doc.get("schema", int, choices={1})
    operations = {name: _operation(name, t) for name, t in doc.table("operations").tables()}
    found = [_pattern(name, t, operations, set(rule_names)) for name, t in doc.table("patterns").tables()]
    matrix = doc.table("matrix_patterns", default={})
    clash = sorted(set(matrix.keys()) & {p.name for p in found})
    if clash:
        raise matrix.error(clash[0], "a name no pattern of [patterns] has")
    found += [_matrix_pattern(name, t, operations) for name, t in matrix.tables()]
    doc.done()
    ordered = sorted(found, key=lambda p: -p.size)   # stable: file order among equals
    return Patterns(path, operations, tuple(ordered))
