"""Shared fixtures: the repository's inputs, editable copies of them in
tmp_path, a checker for InputError messages, and the gate of the GPU tests:
this machine's GPU and its hwdb entry (`device_target`), never a GPU named in
a test."""
from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from aicg import hw
from aicg import target as targets
from aicg.errors import InputError
from aicg.semantics import ruleset as ruleset_mod

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def gpu_device():
    """This machine's GPU, of any kind (a probe measures one the hwdb does not know yet); skips without one."""
    device = targets.present_device()
    if device is None:
        pytest.skip("no CUDA GPU on this machine")
    return device


@pytest.fixture(scope="session")
def device_target() -> hw.Hardware:
    """The hardware record of this machine's GPU: its hwdb entry, found by the device's name and
    compute capability as `doit probe` finds it. GPU tests compile, validate and build for it
    (`doit build target=auto`); they skip where there is no GPU, or none the hwdb has an entry
    for (the reason names the GPU and how to add it)."""
    hardware, reason = targets.gpu_target(REPO / "hwdb", targets.present_device())
    if hardware is None:
        pytest.skip(reason)
    return hardware


@pytest.fixture(scope="session")
def bench_module():
    """A module of tests/bench/ by name, loaded from its file (that folder is not a package)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "tests/bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module   # where dataclasses look a module's names up
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture(scope="session")
def shipped_ruleset():
    return ruleset_mod.load(REPO / "rulesets")


@pytest.fixture
def rules_dir(tmp_path) -> Path:
    """An editable copy of rulesets/ (profiles included)."""
    return Path(shutil.copytree(REPO / "rulesets", tmp_path / "rulesets"))


@pytest.fixture
def hwdb_dir(tmp_path) -> Path:
    """An editable copy of hwdb/."""
    return Path(shutil.copytree(REPO / "hwdb", tmp_path / "hwdb"))


def _edit(path: Path, old: str, new: str) -> Path:
    """Replace the one occurrence of `old` in `path` by `new`."""
    text = Path(path).read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} must occur exactly once in {path}"
    Path(path).write_text(text.replace(old, new), encoding="utf-8")
    return Path(path)


@pytest.fixture
def edit():
    return _edit


@contextlib.contextmanager
def _raises_input_error(file, key: str, expected: str):
    """Expect an InputError naming `file`, the dotted `key`, and containing `expected`."""
    with pytest.raises(InputError) as info:
        yield info
    message = str(info.value)
    assert message.startswith(f"{file}: {key}: expected "), message
    assert expected in message, message
    assert info.value.file == str(file) and info.value.key == key


@pytest.fixture
def raises_input_error():
    return _raises_input_error
