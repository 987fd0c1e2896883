"""`doit explore`: one static HTML page of every operator, its properties and
its legality under each preset, linked to the rules. No server needed."""
from __future__ import annotations

from html import escape

from . import accuracy
from .legality import Preservation, RuleChoice, decide, decide_rule

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 75em; color: #222; }
h1, h2, h3 { font-weight: 600; } code { background: #f3f3f3; padding: 0 .25em; }
table { border-collapse: collapse; margin: .5em 0 1.2em; } td, th { border: 1px solid #ccc; padding: .25em .5em; vertical-align: top; }
th { background: #f5f5f5; text-align: left; } .yes { background: #e6f4e6; } .no { background: #fbe9e9; }
.real { color: #a35c00; } .exact { color: #276b27; } nav a { margin-right: .8em; } small { color: #666; }
"""
DTYPES = ("float32", "bfloat16")


def _properties(props: dict) -> str:
    if not props:
        return "<p><small>no properties recorded</small></p>"
    rows = "".join(f"<tr><td><code>{escape(n)}</code></td><td class='{p.holds}'>{'exactly in floating point' if p.holds == 'exact' else 'in real arithmetic only'}</td>"
                   f"<td><small>{escape(p.ref)}</small></td></tr>" for n, p in sorted(props.items()))
    return f"<table><tr><th>property</th><th>holds</th><th>reference</th></tr>{rows}</table>"


def _rule_link(name: str) -> str:
    return f"<a href='#rule-{escape(name)}'><code>{escape(name)}</code></a>"


def _legality_table(op: str, ruleset) -> str:
    families = ruleset.families_of(op)
    if not families:
        return "<p><small>No kernel family implements this operator yet.</small></p>"
    head = "".join(f"<th>{escape(p)}<br><small>{d}</small></th>" for p in ruleset.presets for d in DTYPES)
    rows = ""
    for family in families:
        cells = ""
        for preset in ruleset.presets.values():
            for dtype in DTYPES:
                pres = Preservation(preset.name, preset.axes, preset.tolerance)
                if not family.realises(dtype):
                    cells += "<td class='no' title='not realised in this dtype (families.toml dtypes)'>-</td>"
                    continue
                legality = decide(op, dtype, ruleset, pres, RuleChoice(frozenset(), None))
                blocking = [f for r in family.rules for f in legality.rules[r].facts if not f.ok]
                cells += _cell(type(legality.families[family.name])(not blocking, tuple(blocking)))
        rules = ", ".join(_rule_link(r) for r in family.rules)
        rows += f"<tr><td><code>{escape(family.name)}</code><br><small>{rules}</small></td>{cells}</tr>"
    return f"<table><tr><th>family (rules)</th>{head}</tr>{rows}</table><small>Hover a cell for the facts that decided it.</small>"


def _cell(decision) -> str:
    why = "\n".join(f.text() for f in decision.facts if not f.ok) or "legal"
    return f"<td class='{'yes' if decision.legal else 'no'}' title='{escape(why)}'>{'legal' if decision.legal else 'illegal'}</td>"


def _rule_table(op_name: str, ruleset) -> str:
    """Every rule whose needs the operator meets, legal or not under each preset."""
    op, everything = ruleset.ops[op_name], RuleChoice(frozenset(), None)
    presets = [Preservation(p.name, p.axes, p.tolerance) for p in ruleset.presets.values()]
    rows = ""
    for rule in ruleset.rules.values():
        probe = decide_rule(rule, op, DTYPES[0], ruleset, presets[0], everything)
        if any(f.kind == "property" and not f.ok for f in probe.facts):
            continue   # the operator lacks a property the rule needs: it never applies
        cells = "".join(_cell(decide_rule(rule, op, d, ruleset, p, everything)) for p in presets for d in DTYPES)
        rows += f"<tr><td>{_rule_link(rule.name)}</td>{cells}</tr>"
    head = "".join(f"<th>{escape(p.preset)}<br><small>{d}</small></th>" for p in presets for d in DTYPES)
    return f"<table><tr><th>rule</th>{head}</tr>{rows}</table>"


def _bound_table(op: str, ruleset) -> str:
    """The longest row each topology's order keeps each preset's rtol on (at its families' fewest
    threads and widest packs: a block's longest chain)."""
    families = [f for f in ruleset.families_of(op) if "topology" in f.params]   # row families: matrix ones bound K
    topologies = list(dict.fromkeys(t for f in families for t in f.params["topology"]))
    if not families or not accuracy.reduces_inexactly(ruleset, op):
        return "<p><small>No rounding reduction: no row length is bounded.</small></p>"
    threads = min(t for f in families for t in f.params["threads"])
    widest = max(v for f in families for v in f.params["vec_bytes"])
    head = "".join(f"<th>{escape(p)}<br><small>{d}</small></th>" for p in ruleset.presets for d in DTYPES)
    rows = ""
    for topology in topologies:
        params = {"topology": topology, "threads": threads, "vec_bytes": widest}
        cells = "".join(f"<td>{_longest_text(accuracy.longest_row(ruleset, op, d, params, p.tolerance[d][0]))}</td>"
                        for p in ruleset.presets.values() for d in DTYPES)
        rows += f"<tr><td><code>{escape(topology)}</code></td>{cells}</tr>"
    return (f"<table><tr><th>topology (t{threads}, {widest}-byte packs)</th>{head}</tr>{rows}</table>"
            f"<small>Elements per row; {escape(ruleset.rounding.ref)}, failing with probability "
            f"{ruleset.rounding.failure_probability:g} a row.</small>")


def _longest_text(longest: int | None) -> str:
    return "any" if longest is None else f"{longest:,}"


def _op_section(name: str, ruleset) -> str:
    op = ruleset.ops[name]
    parts = [f"<h2 id='op-{escape(name)}'>{escape(name)}</h2>", f"<p><code>{escape(op.form)}</code></p>",
             _properties(op.properties)]
    for r in op.reductions:
        parts += [f"<h3>reduction <code>{escape(r)}</code>: <small>{escape(ruleset.reductions[r].form)}</small></h3>",
                  _properties(ruleset.reductions[r].properties)]
    for f in op.functions:
        parts += [f"<h3>function <code>{escape(f)}</code></h3>", _properties(ruleset.functions[f].properties)]
    parts += ["<h3>families under each preset</h3>", _legality_table(name, ruleset),
              "<h3>rules that apply, under each preset</h3>", _rule_table(name, ruleset),
              "<h3>the longest row each order keeps the bound on</h3>", _bound_table(name, ruleset)]
    return "\n".join(parts)


def _rule_section(rule) -> str:
    constraints = lambda c: ", ".join(f"{a} in {list(v)}" for a, v in c.items()) or "-"
    rows = [("summary", escape(rule.summary)), ("acts on", escape(rule.acts_on)),
            ("needs", ", ".join(f"<code>{escape(n)}</code>" for n in rule.needs) or "-"),
            ("requires", escape(constraints(rule.requires))),
            ("when a need holds in real arithmetic only", escape(constraints(rule.inexact))),
            ("deterministic", "yes" if rule.deterministic else "no"),
            ("added error", escape(", ".join(f"{d}: {e:g}" for d, e in rule.added_error.items()) or "-")),
            ("effect on the error", escape(rule.error)), ("reference", f"<small>{escape(rule.ref)}</small>")]
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<h3 id='rule-{escape(rule.name)}'>{escape(rule.name)}</h3><table>{body}</table>"


def page(ruleset) -> str:
    nav = "".join(f"<a href='#op-{escape(n)}'>{escape(n)}</a>" for n in ruleset.ops)
    presets = "".join(f"<tr><td><code>{escape(p.name)}</code></td><td>{escape(p.doc)}</td>"
                      + "".join(f"<td>{escape(repr(p.axes[a]))}</td>" for a in ruleset.axes) + "</tr>"
                      for p in ruleset.presets.values())
    axes_head = "".join(f"<th title='{escape(a.doc)}'>{escape(a.name)}</th>" for a in ruleset.axes.values())
    return "\n".join([
        "<!doctype html><html><head><meta charset='utf-8'><title>aicg operators</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>aicg operator explorer</h1>",
        "<p>Every operator in <code>rulesets/atlas.toml</code>: its form, its properties, and which kernel "
        "families are legal under each preservation preset. Generated by <code>doit explore</code>.</p>",
        f"<nav>{nav} <a href='#rules'>rules</a> <a href='#presets'>presets</a></nav>",
        f"<h2 id='presets'>presets</h2><table><tr><th>preset</th><th>meaning</th>{axes_head}</tr>{presets}</table>",
        *(_op_section(n, ruleset) for n in ruleset.ops),
        "<h2 id='rules'>rules</h2>",
        *(_rule_section(r) for r in ruleset.rules.values()),
        "</body></html>",
    ])
