"""The `name=value` settings of aicg's doit commands: what each means, which tasks read it, and
the check that refuses one no task reads.

doit hands every `name=value` of the command line to whoever asks by name (doit.get_var) and
drops the rest without a word, so `doit build profil=x` would build the default profile. Every
setting is declared here; a name not declared is an error that lists the declared ones, with
the nearest. `doit help <task>` lists the settings of the task (aicg/cli_help.py), read from
the task's meta, which aicg_task_meta() gives.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import suggest
from .errors import InputError

SOURCE = "command line"   # the "file" an error about a setting names
DEFAULT_PROFILE = "rulesets/profiles/default.toml"
META_KEY = "aicg_settings"


@dataclass(frozen=True)
class Setting:
    name: str
    value: str        # how the value is written, for the help
    help: str
    tasks: tuple[str, ...]  # task basenames that read it; () for every task of the instance's graph


GRAPH = ()   # read when the instance's graph loads: every command that loads tasks
SETTINGS = {s.name: s for s in (
    Setting("profile", "PATH", f"the profile of the instance (default: {DEFAULT_PROFILE}); a path that is "
                               f"not in this directory is looked up among the shipped ones", GRAPH),
    Setting("target", "ENTRY|auto", "build the profile's instance for another hwdb entry, or for this "
                                    "machine's GPU (auto); default: the profile's own target", GRAPH),
    Setting("recache", "0|1", "1: take nothing from the store, run every step and store its result again "
                              "(also AICG_RECACHE=1)", GRAPH),
    Setting("op", "OPERATOR", "only this operator (default: every operator of the workload)", ("explain",)),
    Setting("dtype", "DTYPE", "only this dtype (default: the workload's dtypes of the operator)", ("explain",)),
    Setting("budget", "SECONDS", "measure the most decisive realisations first and stop after this many "
                                 "seconds (default: measure all)", ("primitives",)),
    Setting("family", "rows|matrix|all", "measure the row primitives, the matrix family or both (default: all)",
            ("primitives",)),
)}
FLAGS = {"recache": ("", "0", "1")}


def given() -> dict[str, str]:
    """The `name=value` pairs of the command line being run (doit keeps them in a module global,
    which it offers one name at a time only)."""
    from doit import doit_cmd
    return dict(getattr(doit_cmd, "_CMDLINE_VARS", None) or {})


def check(values: dict[str, str]) -> None:
    """Refuse a setting no task reads, or a flag that is neither 0 nor 1."""
    for name, value in sorted(values.items()):
        if name not in SETTINGS:
            listed = ", ".join(f"{n}=" for n in SETTINGS)
            raise suggest.hinted(InputError(SOURCE, name, f"a setting that aicg reads (one of: {listed})",
                                            f"{name}={value}"), suggest.did_you_mean(name, SETTINGS))
        if name in FLAGS and value not in FLAGS[name]:
            raise InputError(SOURCE, name, "0 or 1", value)


def of_task(basename: str) -> list[str]:
    """The names of the settings a task of the instance's graph reads: the graph's, and its own."""
    return [s.name for s in SETTINGS.values() if s.tasks == GRAPH or basename in s.tasks]


def meta(names: list[str]) -> dict:
    """The `meta` of a doit task that reads the settings `names` (what `doit help` lists)."""
    return {META_KEY: list(names)}


def help_lines(task_meta: dict | None, basename: str) -> list[str]:
    """What `doit help <task>` adds for a task of aicg: its settings, one a line."""
    names = (task_meta or {}).get(META_KEY)
    if not names:
        return []
    width = max(len(f"{n}={SETTINGS[n].value}") for n in names)
    lines = ["", f"settings (doit {basename} name=value ...):"]
    lines += [f"  {f'{n}={SETTINGS[n].value}':{width}}  {SETTINGS[n].help}" for n in names]
    return lines
