"""The proposer interface, the template proposer's repairs, the LLM protocol and replay."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aicg import hw, plan_inputs
from aicg.plan import plan_op
from aicg.semantics import legality
from aicg.synth import proposal as proposals
from aicg.synth.template import TemplateProposer
from doit_project import doit, make_project
from llm_server import BROKEN, CORRECT, WRONG, ChatServer, answer, synth_profile

PROFILE = "profile=rulesets/profiles/small.toml"


@pytest.fixture
def tolerance(shipped_ruleset):
    p = shipped_ruleset.presets["tolerance"]
    return legality.Preservation("tolerance", p.axes, p.tolerance), legality.RuleChoice(frozenset(), None)


def source(body, declares=()):
    return proposals.Proposal("llm", "source", tuple(declares), {"threads": 256, "topology": "block"}, body=body)


def test_a_declared_rule_the_profile_forbids_is_rejected(shipped_ruleset, tolerance):
    reasons = proposals.check(source(CORRECT, ["tree_reduction", "fast_intrinsics"]), "softmax", "float32",
                              shipped_ruleset, *tolerance)
    assert len(reasons) == 1 and "declares fast_intrinsics, which is not legal here" in reasons[0]
    assert "needs math in ('approximate')" in reasons[0]


def test_a_rule_used_but_not_declared_is_rejected(shipped_ruleset, tolerance):
    reasons = proposals.check(source(CORRECT.replace("expf(", "__expf("), ["tree_reduction"]), "softmax", "float32",
                              shipped_ruleset, *tolerance)
    assert any("uses fast_intrinsics" in r and "without declaring it" for r in reasons)
    assert any("uses tree_reduction" in r for r in proposals.check(source(CORRECT), "softmax", "float32",
                                                                    shipped_ruleset, *tolerance))


@pytest.mark.parametrize("bad", ['#include <cstdio>', 'asm("trap;");', 'other<<<1, 1>>>();', 'cudaMalloc(0, 0);',
                                 'const T* w = (const T*)nullptr;', 'auto b = (aicg::bf16 *) 0;'])
def test_a_body_that_reaches_outside_device_code_is_rejected(shipped_ruleset, tolerance, bad):
    reasons = proposals.check(source(CORRECT + bad, ["tree_reduction"]), "softmax", "float32", shipped_ruleset, *tolerance)
    assert reasons and "the body contains" in reasons[0]


def test_a_correct_declaration_passes_and_renders_into_the_skeleton(shipped_ruleset, tolerance):
    p = source(CORRECT, ["tree_reduction"])
    assert proposals.check(p, "softmax", "float32", shipped_ruleset, *tolerance) == []
    text, _ = proposals.render(p, "softmax", "float32", shipped_ruleset, "label")
    assert 'extern "C" __global__ void __launch_bounds__(256)' in text and '#line 1 "proposal"' in text

H200_PLAN_INPUTS = plan_inputs.values(plan_inputs.resolve(
    hw.load_target(Path(__file__).resolve().parents[1] / "hwdb", "nvidia-h200"), measured=False))


@pytest.fixture
def template(shipped_ruleset, tolerance):
    pres, choice = tolerance
    decided = {"float32": legality.decide("softmax", "float32", shipped_ruleset, pres, choice)}
    pool = plan_op("softmax", decided, shipped_ruleset.families_of("softmax"), ["float32"], [(4096, 4096)],
                   H200_PLAN_INPUTS, 10**6)
    return TemplateProposer(pool, {f.name: f.rules for f in shipped_ruleset.families_of("softmax")})


def ask(template, *history):
    request = proposals.Request("softmax", "float32", len(history), (), tuple(history))
    return template.propose(request)[0]


def failed(p: proposals.Proposal, outcome: str, k=0) -> dict:
    return {"round": k, "proposal": p.as_record(), "outcome": outcome, "feedback": ""}


def test_the_template_proposer_starts_with_the_best_prior(template):
    first = ask(template)
    assert first.candidate == template.pool[0].id and first.kind == "family"


def test_after_a_compile_error_it_shrinks_the_same_family(template):
    first = ask(template)
    repaired = ask(template, failed(first, "compile_error"))
    assert repaired.family == first.family
    assert (repaired.params["threads"] < first.params["threads"] or repaired.params["vec_bytes"] < first.params["vec_bytes"])


def test_after_wrong_results_it_takes_a_stricter_family(template):
    online = next(c for c in template.pool if c.family == "softmax_online")
    p = proposals.Proposal("template", "family", online.rules, online.params, online.family, candidate=online.id)
    repaired = ask(template, failed(p, "invalid"))
    assert repaired.family == "softmax_twopass"       # no online_softmax: fewer transformations


def test_it_never_proposes_a_candidate_twice(template):
    history = []
    seen = set()
    for k in range(len(template.pool)):
        p = ask(template, *history)
        assert p.candidate not in seen
        seen.add(p.candidate)
        history.append(failed(p, "slow", k))
    assert ask(template, *history) is None


@pytest.fixture
def chat():
    server = ChatServer([answer(BROKEN), answer(WRONG), answer(CORRECT)])
    yield server
    server.stop()


def trajectory(project, k=2):
    return json.loads((project / f"build/small/synth/softmax.float32.{k}.json").read_text())


def test_the_llm_protocol_feeds_compile_errors_back(tmp_path, chat, monkeypatch):
    monkeypatch.setenv("AICG_TEST_LLM_KEY", "sk-test")
    project = make_project(tmp_path / "p", synth_profile(chat.url))
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    first, second = chat.requests[:2]
    assert first["path"] == "/v1/chat/completions" and first["headers"]["Authorization"] == "Bearer sk-test"
    assert first["json"]["model"] == "recorded-model" and first["json"]["temperature"] == 0.0
    assert "Round 0" in second["json"]["messages"][-1]["content"]
    assert "compile_error" in second["json"]["messages"][-1]["content"]
    rounds = trajectory(project)
    assert rounds[0]["outcome"] == "compile_error" and "proposal(" in rounds[0]["feedback"]
    assert rounds[1]["outcome"] == "unvalidated"        # no GPU here: the loop cannot judge, and stops
    assert len(chat.requests) == 2


def test_recorded_answers_replay_with_the_network_unreachable(tmp_path, chat):
    project = make_project(tmp_path / "p", synth_profile(chat.url))
    assert doit(project, "build", PROFILE).code == 0
    before = trajectory(project)
    chat.stop()
    shutil.rmtree(project / "build")
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    after = trajectory(project)
    assert [r["outcome"] for r in after] == [r["outcome"] for r in before]
    assert any("replayed" in note for note in after[1]["notes"])


def test_an_offline_build_without_the_answer_says_so_and_falls_back(tmp_path):
    project = make_project(tmp_path / "p", synth_profile("http://127.0.0.1:9/v1"))
    run = doit(project, "build", PROFILE)
    assert run.code == 0, run.output
    first = trajectory(project)[0]
    assert "no recorded answer" in first["notes"][0] and "unreachable" in first["notes"][0]
    assert first["proposal"]["proposer"] == "template"


def test_a_declaration_the_profile_forbids_is_rejected_in_the_loop(tmp_path):
    server = ChatServer([answer(CORRECT, declares=("tree_reduction", "atomics"))])
    try:
        profile = synth_profile(server.url).replace('preservation = "tolerance"', 'preservation = "deterministic"')
        project = make_project(tmp_path / "p", profile)
        assert doit(project, "build", PROFILE).code == 0
    finally:
        server.stop()
    rounds = trajectory(project)
    assert rounds[0]["outcome"] == "rejected" and "declares atomics, which is not legal here" in rounds[0]["feedback"]


def test_explain_shows_the_trajectory(tmp_path, chat):
    project = make_project(tmp_path / "p", synth_profile(chat.url))
    assert doit(project, "build", PROFILE).code == 0
    manifest = json.loads((project / "build/small/manifest.json").read_text())
    assert [r["outcome"] for r in manifest["synthesis"]["softmax.float32"]] == ["compile_error", "unvalidated"]
    run = doit(project, "explain", "op=softmax", PROFILE)
    assert "synthesis:" in run.output and "round 0 (llm, source proposal): compile_error" in run.output
