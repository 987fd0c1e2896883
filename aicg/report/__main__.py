"""python -m aicg.report: see aicg/report/__init__.py."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import config
from ..cas import Store
from ..errors import InputError
from . import docs, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aicg.report",
                                     description="Write an instance's report.html, or the docs' generated figures.")
    parser.add_argument("instance", nargs="*", type=Path, help="an instance directory, such as build/h100-tolerance")
    parser.add_argument("--docs", action="store_true",
                        help="rewrite the generated parts of README.md and docs/performance.md from docs/bench/")
    parser.add_argument("--check", action="store_true", help="with --docs: write nothing, fail if a part differs")
    parser.add_argument("--root", type=Path, default=Path("."), help="the project (default: the current directory)")
    args = parser.parse_args(argv)
    if not args.docs and not args.instance:
        parser.error("name an instance directory, or --docs")
    if args.check and not args.docs:
        parser.error("--check goes with --docs")
    try:
        if args.docs:
            changed = docs.regenerate(args.root, write=not args.check)
            verb = "differ from the data; run `python -m aicg.report --docs`" if args.check else "rewritten"
            print(f"{', '.join(changed)}: {verb}" if changed else "the generated parts match the data")
            if args.check and changed:
                return 1
        store = Store(config.load(args.root).local) if args.instance else None
        for path in args.instance:
            print(f"wrote {write(path, args.root / 'hwdb', args.root / 'docs/bench', store)}")
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
