"""`doit explain` and `doit explore`: what a person reads about legality."""
import html.parser

from doit_project import doit, make_project

import pytest


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "proj")


def test_explain_prints_every_family_and_rule_with_its_facts(project):
    run = doit(project, "explain", "op=softmax", "dtype=float32")
    assert run.code == 0, run.output
    assert "softmax in float32" in run.output
    for family in ("softmax_twopass", "softmax_online"):
        assert f"+ {family}" in run.output
    assert "- fast_intrinsics" in run.output and "needs math in ('approximate'); the profile has 'precise'" in run.output
    assert run.executed == []   # explaining builds nothing


def test_explain_gives_the_hint_when_nothing_is_legal(project):
    run = doit(project, "explain", "op=softmax", "profile=rulesets/profiles/bitwise.toml")
    assert "hint:" in run.output and "expf has a maximum error of 2 ulp" in run.output
    assert "preset 'deterministic'" in run.output


def test_explain_an_unknown_operator_is_a_clear_error(project):
    run = doit(project, "explain", "op=softmaks")
    assert run.code != 0 and "op=softmaks: expected an operator of the atlas" in run.output


def test_explain_shows_the_chosen_kernel_once_built(project):
    assert doit(project, "build", "profile=rulesets/profiles/small.toml").code == 0
    run = doit(project, "explain", "op=row_sum", "profile=rulesets/profiles/small.toml")
    assert "chosen in the built instance: row_sum_" in run.output


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.cells = set(), set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.add(attrs["href"][1:])
        if tag == "td" and attrs.get("class") in ("yes", "no"):
            self.cells.append(attrs)


def test_explore_writes_one_page_of_every_operator_linked_to_the_rules(project, shipped_ruleset):
    run = doit(project, "explore")
    assert run.code == 0, run.output
    page = _Page()
    page.feed((project / "build/explore/index.html").read_text())
    assert {f"op-{op}" for op in shipped_ruleset.ops} <= page.ids
    assert {f"rule-{r}" for r in shipped_ruleset.rules} <= page.ids
    assert page.links <= page.ids          # no dangling link
    assert any(c["class"] == "no" and "order" in c["title"] for c in page.cells)   # bitwise cells explain why
    assert doit(project, "explore").code == 0 and "wrote" not in doit(project, "explore").output  # up to date


def test_explore_shows_the_longest_row_each_order_keeps_each_presets_bound_on(shipped_ruleset):
    from aicg.semantics import explore
    html = explore.page(shipped_ruleset)
    softmax = html.split("<h2 id='op-softmax'>")[1].split("<h2 ")[0]
    bound = softmax.split("the longest row each order keeps the bound on</h3>")[1]
    thread_row = bound.split("<code>thread</code>")[1].split("</tr>")[0]
    # presets in file order (bitwise, deterministic, tolerance, fast), float32 and bfloat16 each
    assert thread_row.count("<td>") == 2 * len(shipped_ruleset.presets)
    assert "<td>any</td>" in thread_row and "<td>660</td>" in thread_row
    row_max = html.split("<h2 id='op-row_max'>")[1].split("<h2 ")[0]
    assert "No rounding reduction" in row_max
