"""`doit cache stats` and `doit cache gc --max-size SIZE`: the local store by hand.

Registered as a doit command through the `doit.COMMAND` entry point
(pyproject.toml), so it works wherever aicg is installed.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from doit.cmd_base import Command
from doit.exceptions import InvalidCommand

from .. import config
from ..cas import Store

UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not m:
        raise InvalidCommand(f"--max-size: expected a size such as 500M or 2G, found {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


class CacheCommand(Command):
    name = "cache"
    doc_purpose = "inspect or trim the aicg store"
    doc_usage = "stats | gc --max-size SIZE"
    doc_description = ("stats: what the local store holds, the remote it shares, and the last build's hits.\n"
                       "gc: drop the least recently used entries until the local store fits in SIZE.")
    cmd_options = ({"name": "max_size", "long": "max-size", "type": str, "default": "",
                    "help": "gc: the size to trim the local store to (e.g. 500M, 2G)"},)

    def execute(self, opt_values, pos_args):
        # doit stops parsing options at the first word, so `gc --max-size X` arrives here whole
        args = " ".join(pos_args).replace("--max-size=", "--max-size ").split()
        max_size = opt_values.get("max_size") or ""
        if args[1:3] and args[1] == "--max-size":
            max_size, args = args[2], args[:1] + args[3:]
        if args not in (["stats"], ["gc"]):
            raise InvalidCommand(f"doit cache: expected 'stats' or 'gc --max-size SIZE', found {' '.join(pos_args) or 'nothing'}")
        cfg = config.load(Path.cwd())
        store = Store(cfg.local)
        if args == ["gc"]:
            if not max_size:
                raise InvalidCommand("doit cache gc: --max-size SIZE is required")
            removed, freed = store.gc(parse_size(max_size))
            print(f"removed {removed} files ({_human(freed)}) from {cfg.local}")
            return 0
        entries = list(store.entries())
        objects = [e for e in entries if e[0].parent.parent.name == "objects"]
        actions = [e for e in entries if e[0].parent.parent.name == "actions"]
        print(f"local store   {cfg.local}")
        print(f"  objects     {len(objects)} ({_human(sum(e[1] for e in objects))})")
        print(f"  actions     {len(actions)} ({_human(sum(e[1] for e in actions))})")
        if entries:
            oldest = min(e[2] for e in entries)
            print(f"  least recently used: {time.strftime('%Y-%m-%d %H:%M', time.localtime(oldest))}")
        print(f"remote store  {cfg.remote or 'none'}" + (f" ({'write' if cfg.writable else 'read'} mode, "
                                                         f"{'signed' if cfg.signing_key else 'unsigned'})" if cfg.remote else ""))
        last = cfg.local / "last-build.json"
        if last.exists():
            record = json.loads(last.read_text())
            counters = ", ".join(f"{k} {v}" for k, v in record["counters"].items())
            print(f"last build    {record['instance']}: {counters}")
        return 0
