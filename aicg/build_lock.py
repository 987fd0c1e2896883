"""One build of an instance at a time in a directory.

Two `doit build`s writing the same build/<instance>/ at once would each see the other's steps
start and finish under them: a step whose inputs change while it runs fails (aicg/tasks/step.py),
and one build may package what the other was rewriting. So a build holds an exclusive lock on
build/.locks/<instance>.lock from when it starts running steps until it is done (release()); a
second one says whose build it waits for, waits, and then finds the steps done. Where the build
directory cannot be written or the platform has no flock, there is no lock.

A process forked from a build (doit's -n workers) closes its copy of the descriptor at once, so
the lock lives and dies with the build's own process, and on Linux it is ended when the build's
process ends: a build killed mid-way leaves no worker waiting for it forever.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

try:
    import fcntl
except ImportError:   # no flock (Windows): builds are not serialised
    fcntl = None

LOCKS = ".locks"
_held: dict[str, int] = {}   # lock path -> the open descriptor that holds it


def path_for(build_dir: Path, instance: str) -> Path:
    return Path(build_dir) / LOCKS / f"{instance}.lock"


def hold(build_dir: Path, instance: str, say) -> None:
    """Take the instance's lock, waiting (and saying so through `say`) while another process has it."""
    path = path_for(build_dir, instance)
    if fcntl is None or str(path) in _held:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        say(f"aicg: another build of {instance} is running in this directory (process {holder}); "
            f"waiting for it to finish\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    _held[str(path)] = fd


PR_SET_PDEATHSIG = 1   # linux/prctl.h


def _in_forked_child() -> None:
    """Close the inherited descriptors without unlocking (an unlock would free the parent's lock
    too: flock belongs to the open file, which they share); on Linux, end with the parent.

    The parent's death is signalled with SIGKILL: a SIGTERM ignored by whatever started the build is
    ignored by its workers too (the disposition survives fork and exec), and they would linger."""
    while _held:
        _, fd = _held.popitem()
        os.close(fd)
    if sys.platform == "linux":
        parent = os.getppid()
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:   # the parent was gone before the signal was asked for
            os._exit(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


def release() -> None:
    """Let the next build of every instance this process holds go on (closing the descriptor frees
    the lock; the file stays, empty of any process)."""
    while _held:
        _, fd = _held.popitem()
        os.ftruncate(fd, 0)
        os.close(fd)
