"""Where a command finds its inputs: this directory's, over those aicg ships.

A checkout holds rulesets/, hwdb/ and kernels/ beside aicg/; an installed aicg ships the same
three inside its package (pyproject.toml maps them). A directory that holds a rulesets/ of its
own (a checkout, or a copy of one) is a project of its own: it reads its own rulesets/, hwdb/
and kernels/ (the shipped kernels where it has none). Any other directory reads:

- the shipped rule sets and kernels;
- the shipped hwdb entries, with this directory's hwdb/ over them (a file of the same name
  replaces the shipped one). Where it has a hwdb/, the command reads a view of the two made
  of links in build/.inputs/hwdb/; what a command writes there (doit probe, primitives,
  record) goes to this directory's hwdb/;
- profile=PATH: the path from this directory, else the same path among the shipped files
  (profile=rulesets/profiles/fast.toml works anywhere).

Build outputs (build/), the local store (cache/) and [tool.aicg] settings (pyproject.toml)
are this directory's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import suggest
from .errors import InputError

PACKAGE = Path(__file__).resolve().parent
DATA = ("rulesets", "hwdb", "kernels")
VIEW = Path("build/.inputs/hwdb")


def shipped(name: str) -> Path:
    """The shipped `name` (rulesets, hwdb or kernels): inside the installed package, or beside
    aicg/ in a checkout (and an editable install of one)."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name


@dataclass(frozen=True)
class Layout:
    """Where an instance's inputs live; what aicg.tasks.graph.Layout gives for a checkout."""
    root: Path
    rules: Path
    hwdb: Path
    kernels: Path
    own_hwdb: Path   # where this directory's entries are written: root/hwdb


def resolve(root: Path) -> Layout:
    root = Path(root).resolve()
    own = root / "hwdb"
    kernels = root / "kernels" if (root / "kernels").is_dir() else shipped("kernels")
    if (root / "rulesets").is_dir():
        return Layout(root, root / "rulesets", own, kernels, own)
    theirs = shipped("hwdb")
    hwdb = _view(root / VIEW, theirs, own) if own.is_dir() and theirs.is_dir() else own if own.is_dir() else theirs
    return Layout(root, shipped("rulesets"), hwdb, kernels, own)


def _view(view: Path, *layers: Path) -> Path:
    """A directory of links to the files of `layers`, a later layer's file over an earlier's of
    the same name; links to files no layer has now are removed."""
    wanted: dict[str, Path] = {}
    for layer in layers:
        wanted.update({p.name: p.resolve() for p in layer.iterdir() if p.is_file()})
    view.mkdir(parents=True, exist_ok=True)
    for link in view.iterdir():
        if link.name not in wanted or not link.is_symlink() or Path(os.readlink(link)) != wanted[link.name]:
            link.unlink()
    for name, target in wanted.items():
        link = view / name
        if not link.is_symlink():
            link.symlink_to(target)
    return view


def profile_path(typed: str, root: Path) -> Path:
    """The profile `profile=typed` names: from `root`, else among the shipped files; a path
    found in neither is an error naming the nearest profile there is."""
    path = Path(typed)
    candidates = [path if path.is_absolute() else Path(root) / path]
    if not path.is_absolute() and path.parts[:1] == ("rulesets",):
        candidates.append(shipped("rulesets").joinpath(*path.parts[1:]))
    for found in candidates:
        if found.exists():
            return found
    near = {}
    for found in candidates:
        if found.parent.is_dir():
            near.update({str(Path(typed).parent / p.name): p for p in found.parent.glob("*.toml")})
    listed = f" (in {Path(typed).parent}/: {', '.join(sorted(Path(n).name for n in near))})" if near else ""
    raise suggest.hinted(InputError("command line", "profile", "the path of a profile TOML file" + listed, typed),
                         suggest.did_you_mean(typed, near))
