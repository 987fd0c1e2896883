"""Kernels compiled ahead on threads (aicg/nvrtc.compile_ahead) while a build that runs its steps one
at a time (on a GPU node) validates the first ones: the same cubins, reports and instance, each
kernel compiled once, nothing left compiling after the build."""
from __future__ import annotations

import tomllib

import pytest

from aicg import nvrtc
from aicg.errors import CompileError
from aicg.tasks import doit_tasks
from doit_project import SMALL_PROFILE, SMALL_PROFILE_COMPILATIONS, doit, instance_dir, make_project

PROFILE = "profile=rulesets/profiles/small.toml"

TARGET = tomllib.loads(SMALL_PROFILE)["instance"]["target"]
KERNEL = 'extern "C" __global__ void k(float* x) {{ x[threadIdx.x] *= {}.0f; }}\n'


def test_a_program_compiled_ahead_is_taken_not_compiled_again():
    programs = [(KERNEL.format(n), f"ahead{n}.cu", {}, "sm_80") for n in (3, 5)]
    assert nvrtc.compile_ahead(programs, workers=2) == 2
    assert nvrtc.compile_ahead(programs, workers=2) == 0          # already started
    taken = nvrtc.compile_cubin(*programs[0])
    before = nvrtc.compilations
    direct = nvrtc._compile_now(*programs[0], "kernels")
    assert taken == direct and nvrtc.compilations == before + 1   # the same cubin, report and log
    before = nvrtc.compilations
    nvrtc.compile_cubin(*programs[1])
    assert nvrtc.compilations == before                           # compiled ahead: not again
    assert nvrtc._ahead == {}


def test_a_compile_error_ahead_is_raised_by_the_compile_that_takes_it():
    bad = ('extern "C" __global__ void k(float* x) { x[0] = undeclared; }\n', "bad_ahead.cu", {}, "sm_80")
    nvrtc.compile_ahead([bad], workers=1)
    with pytest.raises(CompileError, match="bad_ahead.cu"):
        nvrtc.compile_cubin(*bad)


def test_what_no_compile_took_is_dropped_when_the_build_ends():
    nvrtc.compile_ahead([(KERNEL.format(n), f"left{n}.cu", {}, "sm_80") for n in range(7, 11)], workers=1)
    nvrtc.finish_ahead()
    assert nvrtc._ahead == {}
    before = nvrtc.compilations
    nvrtc.finish_ahead()
    assert nvrtc.compilations == before


def test_a_build_compiling_ahead_makes_the_same_instance_compiling_each_kernel_once(tmp_path, monkeypatch):
    plain = make_project(tmp_path / "plain")
    run = doit(plain, "build", PROFILE)
    assert run.code == 0 and run.compilations == SMALL_PROFILE_COMPILATIONS, run.output
    ahead = make_project(tmp_path / "ahead")
    started = []
    monkeypatch.setattr(doit_tasks, "compiles_ahead", lambda: True)
    monkeypatch.setattr(nvrtc, "compile_ahead", lambda programs, workers, real=nvrtc.compile_ahead:
                        started.append(real(programs, workers)) or started[-1])
    run = doit(ahead, "build", PROFILE)
    assert run.code == 0, run.output
    # the first compile step starts every kernel the build lacks, its own among them: each once
    assert started == [SMALL_PROFILE_COMPILATIONS] and run.compilations == SMALL_PROFILE_COMPILATIONS
    assert nvrtc._ahead == {}
    built = instance_dir(plain, TARGET).name
    assert (ahead / "build" / built / "manifest.json").read_bytes() == \
        (plain / "build" / built / "manifest.json").read_bytes()
    # a second build holds everything: nothing to compile ahead
    started.clear()
    assert doit(ahead, "build", PROFILE).executed == [] and started == []


def test_a_head_start_that_fails_leaves_each_step_to_compile_its_own(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p")
    monkeypatch.setattr(doit_tasks, "compiles_ahead", lambda: True)

    def broken(programs, workers):
        raise OSError("no threads here")
    monkeypatch.setattr(nvrtc, "compile_ahead", broken)
    run = doit(project, "build", PROFILE)
    assert run.code == 0 and run.compilations == SMALL_PROFILE_COMPILATIONS, run.output
    assert "the kernels are compiled one at a time (OSError: no threads here)" in run.output
