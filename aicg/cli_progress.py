"""Progress of the long steps on a terminal: done of total, elapsed time and an estimate.

Builds, probes and the lab (compiling, then measuring) show a bar (tqdm) while they run on a
terminal; elsewhere (a CI log, a pipe) nothing is drawn and the lines they print are all
there is, one per task, as before.
"""
from __future__ import annotations

import os
import sys
import time


def on_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


class Bar:
    """A progress bar on `stream` where it is a terminal; otherwise it only counts."""

    def __init__(self, total: int, what: str, unit: str = "task", stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.started = total, 0, time.monotonic()
        self._bar = None
        if on_terminal(self.stream) and total > 0:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=what, unit=unit, file=self.stream, leave=False, dynamic_ncols=True,
                             bar_format="{desc}: {n_fmt}/{total_fmt} {unit}s |{bar}| {elapsed} elapsed, "
                                        "{remaining} left{postfix}")

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def advance(self, n: int = 1, now: str | None = None) -> None:
        self.done += n
        if self._bar is not None:
            if now is not None:
                self._bar.set_postfix_str(now, refresh=False)
            self._bar.update(n)

    def show(self, now: str) -> None:
        """Name what runs now beside the bar."""
        if self._bar is not None:
            self._bar.set_postfix_str(now)

    def write(self, text: str) -> None:
        """Lines above the bar (or plainly, without one)."""
        if self._bar is not None:
            self._bar.write(text.rstrip("\n"), file=self.stream)
        else:
            self.stream.write(text if text.endswith("\n") else text + "\n")
            self.stream.flush()

    def clear(self) -> None:
        """Take the bar off the screen while something else prints; it comes back on advance()."""
        if self._bar is not None:
            self._bar.clear()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def lines_through(bar: Bar | None, say):
    """A progress callback that prints above `bar` (where there is one) rather than through it."""
    return say if bar is None or not bar.drawn else bar.write
