""""Did you mean ...?": the known name nearest to one that was mistyped.

Every error that refuses a name (an operator, a dtype, a profile, a TOML key,
a target, a `name=value` on the command line) lists the names it knows; this
adds the one the user most likely meant, so a typo is fixed without reading
the list.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable

# difflib's ratio below which a name is not offered: "sofmax" -> "softmax" is 0.92, "dtype" ->
# "target" 0.55; unrelated names of this project's length score under 0.5.
CUTOFF = 0.6


def nearest(typed: str, known: Iterable[str]) -> str | None:
    """The known name that holds what was typed, where only one does ("h100" for "h100-sxm"),
    else the closest spelling (case aside), else None."""
    names = sorted(set(known))
    if not typed or not names:
        return None
    lowered = typed.lower()
    exact = [n for n in names if n.lower() == lowered]
    if exact:
        return exact[0]
    holding = [n for n in names if lowered in n.lower()]
    if len(holding) == 1:
        return holding[0]
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(lowered, list(by_lower), n=1, cutoff=CUTOFF)
    return by_lower[close[0]] if close else None


def did_you_mean(typed: str, known: Iterable[str]) -> str:
    """"Did you mean X?" for the nearest known name, or "" where none is near."""
    found = nearest(typed, known)
    return f"Did you mean {found}?" if found is not None and found != typed else ""


def hinted(error: Exception, hint: str) -> Exception:
    """`error` with `hint` ("Did you mean X?") after its message, where there is one."""
    if hint:
        error.args = (f"{error.args[0]}. {hint}", *error.args[1:])
    return error
