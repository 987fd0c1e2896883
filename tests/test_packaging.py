"""`pip install .` (not editable) gives a working tool: a wheel built from the project, installed
into a fresh environment, builds an instance in an empty directory from what it ships (rule
sets, hwdb entries with their validation record, kernels), and reads a user's own profiles and
hwdb entries on top of them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "MANIFEST.in", "README.md")
DATA = ("rulesets", "hwdb", "kernels")

# One operator of the default profile at its shapes and settings: its validations are those of the
# shipped record, so a machine without a GPU gets validated kernels.
SMALL = """[instance]
name = "small-h100"
target = "h100-sxm"
preservation = "tolerance"

[plan]
candidates_per_family = 4

[[workload]]
ops = ["row_max"]
dtypes = ["float32"]
shapes = [[32768, 4096], [4096, 32768], [8192, 1000], [65536, 128]]
"""


def _run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _copy_sources(into: Path) -> Path:
    """What a source checkout holds, without its builds, stores or caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.partial.json")
    for name in SOURCES:
        shutil.copy(REPO / name, into / name)
    for name in ("aicg", *DATA):
        shutil.copytree(REPO / name, into / name, ignore=ignore)
    return into


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = _copy_sources(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("wheel")
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source,
                 cwd=source)
    assert built.returncode == 0, built.stderr
    return next(out.glob("aicg-*.whl"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel) -> Path:
    """The wheel installed into a directory of its own, seen first on the path of this environment's
    Python (whose site-packages give the dependencies, NVRTC's library among them, and hold no aicg
    but an editable link, which a module on the path comes before)."""
    target = tmp_path_factory.mktemp("installed")
    done = _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", target, wheel,
                cwd=target)
    assert done.returncode == 0, done.stderr
    return target


def _environment(installed: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AICG_", "PYTHON"))}
    return {**env, "PYTHONPATH": str(installed)}


def _aicg(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(installed / "bin" / "aicg", *args, cwd=cwd, env=_environment(installed))


def _python(installed: Path, cwd: Path, code: str) -> str:
    return _run(sys.executable, "-c", code, cwd=cwd, env=_environment(installed)).stdout.strip()


def _python_files() -> list[str]:
    """The project's modules: those git tracks in a checkout (work not added yet ships with its commit)."""
    tracked = _run("git", "ls-files", "aicg", cwd=REPO) if (REPO / ".git").exists() else None
    if tracked is not None and tracked.returncode == 0:
        return [line for line in tracked.stdout.splitlines() if line.endswith(".py")]
    return [p.relative_to(REPO).as_posix() for p in (REPO / "aicg").rglob("*.py") if "__pycache__" not in p.parts]


def test_the_wheel_holds_every_package_and_the_shipped_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(Path(p).parent.as_posix()) for p in _python_files()}
    missing = sorted(p for p in packages if not any(n.startswith(p + "/") and n.count("/") == p.count("/") + 1
                                                    for n in names))
    assert not missing, f"packages not in the wheel (list them in pyproject.toml [tool.setuptools] packages): {missing}"
    for name in DATA:
        shipped = {p.relative_to(REPO / name).as_posix() for p in (REPO / name).rglob("*")
                   if p.is_file() and not p.name.endswith(".partial.json") and "__pycache__" not in p.parts}
        assert {f"aicg/{name}/{p}" for p in shipped} <= names, name
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "aicg = aicg.cli:main" in text and "help = aicg.cli_help:Help" in text


def test_an_installed_aicg_builds_in_an_empty_directory_from_what_it_ships(installed, tmp_path):
    module, hwdb = _python(installed, tmp_path, "import aicg, aicg.cli_layout as l; "
                                                "print(aicg.__file__); print(l.shipped('hwdb'))").split()
    assert Path(module) == installed / "aicg" / "__init__.py" and Path(hwdb) == installed / "aicg" / "hwdb"

    (tmp_path / "small.toml").write_text(SMALL)
    run = _aicg(installed, tmp_path, "build", "profile=small.toml")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 validations from the record" in run.stdout and "1 of 1 kernels validated on NVIDIA H100" in run.stdout
    manifest = json.loads((tmp_path / "build/small-h100/manifest.json").read_text())
    assert manifest["kernels"]["row_max.float32"]["validation"] == "passed"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".doit.db", "build", "cache", "small.toml"]   # nothing else

    again = _aicg(installed, tmp_path, "build", "profile=small.toml")
    assert again.returncode == 0 and "nothing to do" in again.stdout

    helped = _aicg(installed, tmp_path, "help", "build")
    assert all(f"{name}=" in helped.stdout for name in ("profile", "target", "recache")), helped.stdout


def test_a_users_own_hwdb_entry_and_a_shipped_profile_by_its_path(installed, tmp_path):
    own = tmp_path / "hwdb"
    own.mkdir()
    shipped = Path(_python(installed, tmp_path, "import aicg.cli_layout as l; print(l.shipped('hwdb'))"))
    (own / "my-h100.toml").write_text((shipped / "h100-sxm.toml").read_text())
    listed = _aicg(installed, tmp_path, "list", "profile=rulesets/profiles/fast.toml", "target=my-h100")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "build compiler instance my-h100-fast" in listed.stdout

    unknown = _aicg(installed, tmp_path, "list", "target=my-h10")
    assert unknown.returncode != 0 and "Did you mean my-h100?" in unknown.stderr + unknown.stdout
    # the shipped entries are still there beside it
    assert _aicg(installed, tmp_path, "list", "target=nvidia-h200").returncode == 0
