"""The README and the docs a user reads: short, generated where they state figures, and true to
the code (every command, setting, flag, variable, path and link they name exists)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doit.doit_cmd import DoitMain

from aicg.report import docs
from doit_project import REPO, make_project

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
LOG = REPO / "docs/performance.md"   # the dated log: it quotes commands as they were then


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _current(path: Path) -> str:
    """What a page says now: the whole page, or for the dated log its generated opening."""
    text = _text(path)
    if path == LOG:
        return text[:text.index(docs.end("current-figures"))]
    return text


def _code_spans(text: str) -> list[str]:
    """Inline code and the lines of fenced blocks."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S))
    return [line for block in blocks for line in block.splitlines()] + inline


def test_the_readme_reads_in_five_minutes():
    assert len(_text(README).splitlines()) < 150


def test_the_readme_opens_with_the_two_commands_ci_runs():
    first_block = re.search(r"```sh\n(.*?)```", _text(README), re.S).group(1).splitlines()
    ci = _text(REPO / ".ci/run").splitlines()
    assert len(first_block) == 2
    for command in first_block:   # as it stands, or with CI's log kept beside it (| tee ...)
        assert any(line == command or line.startswith(command + " | ") for line in ci), command


def test_the_generated_figures_match_the_recorded_runs():
    """README's headline and build summary and docs/performance.md's current figures are what
    `python -m aicg.report --docs` makes of docs/bench/ (a figure typed over one is caught)."""
    assert docs.regenerate(REPO, write=False) == [], "run `python -m aicg.report --docs`"


def test_the_docs_generator_rewrites_only_between_its_markers(tmp_path):
    (tmp_path / "README.md").write_text(f"intro\n{docs.begin('x')}\nold\n{docs.end('x')}\noutro\n")
    text = docs.replace((tmp_path / "README.md").read_text(), "x", "new", "README.md")
    assert text == f"intro\n{docs.begin('x')}\nnew\n{docs.end('x')}\noutro\n"
    with pytest.raises(Exception) as info:
        docs.replace("no markers here", "x", "new", "README.md")
    assert "README.md: x: expected one part between" in str(info.value)


def test_every_local_link_resolves():
    for page in [README, *PAGES]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _text(page)):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"


def test_every_path_the_docs_name_exists():
    roots = ("aicg/", "tests/", "rulesets/", "kernels/", "docs/", ".ci/")
    for page in [README, *PAGES]:
        for span in _code_spans(_current(page)):
            if span.startswith("ERROR:"):
                continue   # an error message, quoted with the file it names
            for path in re.findall(r"(?<![\w/.])((?:%s)[\w./-]+)" % "|".join(map(re.escape, roots)), span):
                path = path.rstrip(".,:")
                if any(c in path for c in "<>*{") or path.startswith("trials/"):
                    continue
                assert (REPO / path).exists(), f"{page.name} names {path}, which is not there"


@pytest.fixture(scope="module")
def doit_names(tmp_path_factory) -> set[str]:
    """Every task basename `doit list --all` gives, and every command doit has here."""
    project = make_project(tmp_path_factory.mktemp("readme") / "proj")
    env = {**os.environ, "AICG_CACHE_DIR": str(project / "cache")}
    run = subprocess.run([sys.executable, "-m", "doit", "list", "--all"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    tasks = {line.split()[0].split(":")[0] for line in run.stdout.splitlines() if line.strip()}
    commands = {c.get_name() for c in DoitMain.DOIT_CMDS} | {"cache"}   # cache: aicg's command (pyproject.toml)
    return tasks | commands


def _settings_read_by_the_code() -> set[str]:
    names = set()
    for path in (REPO / "aicg").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        names |= set(re.findall(r"get_var\(\s*\"(\w+)\"", source))
        names |= set(re.findall(r"Setting\(\s*\"(\w+)\"", source))
    return names


def test_every_doit_command_and_setting_the_docs_name_exists(doit_names):
    settings = _settings_read_by_the_code()
    seen = set()
    for page in [README, *PAGES]:
        for span in _code_spans(_current(page)):
            for call in re.findall(r"(?:^|[\s(`&;])doit ([^#`|&;]*)", span):
                words = call.split()
                if not words or not re.fullmatch(r"[a-z][\w:-]*", words[0]):
                    continue
                name = words[0].split(":")[0]
                seen.add(name)
                assert name in doit_names, f"{page.name}: `doit {call.strip()}` names no task or command"
                for setting in re.findall(r"(?<![-\w])(\w+)=", " ".join(words[1:])):
                    assert setting in settings, f"{page.name}: `doit {call.strip()}`: no task reads {setting}="
    assert {"build", "report", "explain", "probe", "primitives", "cache"} <= seen   # the pattern still finds them


def test_every_flag_of_a_bench_script_the_docs_name_exists():
    checked = 0
    for page in [README, *PAGES]:
        for span in _code_spans(_current(page)):
            scripts = re.findall(r"tests/bench/(\w+\.(?:py|sh))", span)
            if len(scripts) != 1:
                continue
            source = _text(REPO / "tests/bench" / scripts[0])
            for flag in re.findall(r"(?<![\w-])(--[\w-]+)", span):
                assert flag in source, f"{page.name}: {scripts[0]} has no {flag}"
                checked += 1
    assert checked > 10   # the pattern still finds the scripts' flags


def test_every_setting_variable_the_docs_name_is_read_somewhere():
    code = "".join(_text(p) for p in [*(REPO / "aicg").rglob("*.py"), *(REPO / "tests").rglob("*.py"),
                                      *(REPO / "tests/bench").glob("*.sh"), REPO / ".ci/run"])
    for page in [README, *PAGES]:
        for name in set(re.findall(r"\b(AICG_[A-Z_]+)\b", _current(page))):
            assert name in code, f"{page.name} names {name}, which nothing reads"
