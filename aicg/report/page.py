"""The instance report: one self-contained HTML page (no script, nothing fetched).

It says, per kernel, how fast it is and against what ceiling, which candidates it was chosen
over, and why its rules are legal (each rule's facts once, with the kernels they hold for); then
the plots: the lab's bandwidth against row length with the copy ceiling and the chosen kernel, the
probe curves with their knees, and the latest benchmark against its peers.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from . import bench, figures as figs, kernels, tables
from .instance import Instance

STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2430;
       margin: 0; background: #ffffff; }
main { max-width: 1160px; margin: 0 auto; padding: 24px 20px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; } h2 { font-size: 20px; margin: 36px 0 8px; border-bottom: 1px solid #d9dee8; }
h3 { font-size: 16px; margin: 24px 0 6px; }
p.lead { color: #454c5a; margin: 4px 0 14px; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 13.5px; }
th, td { padding: 4px 9px; border-bottom: 1px solid #e4e8ef; text-align: left; vertical-align: top; }
th { background: #f1f4f9; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.chosen td { background: #fff4ec; } td.best { font-weight: 700; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.status-passed { color: #007a5a; } .status-failed, .status-none { color: #b3261e; }
.status-unvalidated, .status-unverified { color: #9a6700; font-weight: 600; }
.grid { display: flex; flex-wrap: wrap; gap: 14px 18px; }
figure { margin: 0; } figcaption { font-size: 12.5px; color: #59606e; max-width: 350px; }
figure.wide figcaption { max-width: none; }
ul.facts { margin: 4px 0 10px; padding-left: 20px; } ul.facts li { margin: 2px 0; }
.who { color: #59606e; font-size: 12.5px; }
.note { background: #fff8e6; border-left: 3px solid #e69f00; padding: 6px 10px; margin: 8px 0; }
"""


def _us(seconds: float | None) -> str:
    return "-" if not seconds else f"{seconds * 1e6:.1f}"


def _tb(value: float | None) -> str:
    return "-" if not value else f"{value / 1e12:.2f}"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _status(status: str | None) -> str:
    status = status or "none"
    return f'<span class="status-{escape(status)}">{escape(status)}</span>'


def _num(text: str, data: dict | None = None) -> str:
    attrs = "".join(f' data-{k}="{v!r}"' if isinstance(v, float) else f' data-{k}="{escape(str(v))}"'
                    for k, v in (data or {}).items() if v is not None)
    return f'<td class="n"{attrs}>{text}</td>'


def _header(instance: Instance, top: kernels.Ceiling | None) -> list[str]:
    m = instance.manifest
    preservation = m["preservation"]
    axes = ", ".join(f"{k} {v}" for k, v in sorted(preservation.get("axes", {}).items()))
    prior = m.get("prior")
    prior_text = (f"the lab's realisation profile {escape(prior['profile'])} ({escape(prior['device'])}, "
                  f"{escape(prior['date'])})" if prior else "the datasheet and the probes (no lab profile)")
    kernels_all = m["kernels"]
    passed = sum(1 for k in kernels_all.values() if k["validation"] == "passed")
    devices = sorted({k.get("validated_on") or "" for k in kernels_all.values() if k["validation"] == "passed"} - {""})
    toolchain = ", ".join(f"{k} {v}" for k, v in sorted(m.get("toolchain", {}).items()))
    lines = [f"<h1>aicg instance {escape(instance.name)}</h1>",
             f'<p class="lead">Built for an {escape(instance.target["name"])} ({escape(instance.target["arch"])}), '
             f"preservation <b>{escape(preservation.get('preset', '?'))}</b> ({escape(axes)}); planned on "
             f"{prior_text}. {passed} of {len(kernels_all)} kernels validated"
             + (f" on {escape(', '.join(devices))}" if devices else "") + ". "
             + (f"Copy ceiling: {escape(top.describe())}." if top else "The target has no copy bandwidth fact.")
             + "</p>", f'<p class="lead">Toolchain: {escape(toolchain)}.</p>']
    if passed < len(kernels_all):
        lines.append(f'<p class="note">{len(kernels_all) - passed} kernels are not validated on the target, so they '
                     f"have no measured time; build on a {escape(instance.target['name'])}, share its store, or use its "
                     f"validation record (<code>doit record</code>) to time them.</p>")
    for name, reason in sorted(m.get("unavailable", {}).items()):
        lines.append(f'<p class="note">{escape(name)}: no kernel ({escape(reason)}).</p>')
    return lines


def _summary(all_kf: list[kernels.KernelFigures], top: kernels.Ceiling | None) -> list[str]:
    out = ["<h2 id=\"kernels\">Kernels</h2>",
           "<p>Time: the geometric mean of the chosen kernel's medians over the workload's shapes, as the build "
           "measured it. Bandwidth and its share of the copy ceiling: at the workload shape that moves the most "
           "bytes, run by the kernel fastest there (a kernel that mostly reads, such as a row sum, can pass the copy: "
           "reading alone is faster than reading and writing). Details and every candidate per kernel are below.</p>",
           "<table class=\"kernels\"><tr><th>operator</th><th>dtype</th><th>chosen kernel</th><th>validation</th>"
           "<th class=\"n\">time (µs)</th><th>largest shape</th><th class=\"n\">TB/s</th><th class=\"n\">of copy</th>"
           "<th class=\"n\">valid candidates</th></tr>"]
    for kf in all_kf:
        big = kf.largest
        out.append(f'<tr data-kernel="{escape(kf.name)}"><td><a href="#{escape(kf.name)}">{escape(kf.op)}</a></td>'
                   f"<td>{escape(kf.dtype)}</td><td><code>{escape(kf.entry['candidate'])}</code></td>"
                   f"<td>{_status(kf.entry['validation'])}</td>"
                   + _num(_us(kf.entry.get("measured_seconds")), {"seconds": kf.entry.get("measured_seconds")})
                   + (f"<td>{big.rows}×{big.cols}</td>" if big else "<td>-</td>")
                   + _num(_tb(big.bytes_per_second if big else None),
                          {"bytes-per-second": big.bytes_per_second if big else None})
                   + _num(_pct(big.share if big else None), {"share": big.share if big else None})
                   + _num(f"{len(kf.valid)} of {len(kf.candidates)}") + "</tr>")
    out.append("</table>")
    return out


def _kernel_detail(kf: kernels.KernelFigures, top: kernels.Ceiling | None) -> list[str]:
    e = kf.entry
    out = [f'<h3 id="{escape(kf.name)}">{escape(kf.name)}: <code>{escape(e["candidate"])}</code></h3>',
           f"<p>Chosen: {escape(e['basis'])}; {escape(e['family'])} of {len(e.get('legal_families', []))} legal "
           f"families, {e.get('considered', len(kf.candidates))} candidates; validation {_status(e['validation'])}"
           + (f" on {escape(e['validated_on'])}" if e.get("validated_on") else "")
           + (f"; its order keeps the bound on rows of at most {e['longest_row']} elements" if e.get("longest_row") else "")
           + ".</p>",
           '<table class="shapes"><tr><th>workload shape</th><th>runs</th><th class="n">time (µs)</th>'
           '<th class="n">bytes moved</th><th class="n">TB/s</th><th class="n">of copy</th></tr>']
    for s in kf.shapes:
        out.append(f'<tr data-shape="{s.rows}x{s.cols}"><td>{s.rows}×{s.cols}</td>'
                   f"<td><code>{escape(s.candidate or '-')}</code></td>"
                   + _num(_us(s.seconds), {"seconds": s.seconds}) + _num(f"{s.bytes:,}" if s.bytes else "-")
                   + _num(_tb(s.bytes_per_second), {"bytes-per-second": s.bytes_per_second})
                   + _num(_pct(s.share), {"share": s.share}) + "</tr>")
    out.append("</table>")
    shapes = [(s.rows, s.cols) for s in kf.shapes]
    fastest = {shape: min((c.times[shape] for c in kf.valid if shape in c.times), default=None) for shape in shapes}
    out.append('<table class="candidates"><tr><th>candidate</th><th>status</th><th class="n">time (µs)</th>'
               + "".join(f'<th class="n">{r}×{c}</th>' for r, c in shapes) + "<th>note</th></tr>")
    for c in kf.candidates:
        cells = []
        for shape in shapes:
            t = c.times.get(shape)
            best = ' best' if t is not None and t == fastest[shape] and c.status == "passed" else ""
            cells.append(f'<td class="n{best}">{_us(t)}</td>')
        note = c.reason or ("chosen" if c.chosen else "")
        if c.times and len(c.times) < len(shapes) and not c.reason:
            note = (note + "; " if note else "") + "timed only on the rows its order keeps the bound on"
        out.append(f'<tr class="{"chosen" if c.chosen else ""}" data-candidate="{escape(c.id)}">'
                   f"<td><code>{escape(c.id)}</code></td><td>{_status(c.status)}</td>"
                   + _num(_us(c.seconds), {"seconds": c.seconds}) + "".join(cells) + f"<td>{escape(note)}</td></tr>")
    out.append("</table>")
    return out


def _legality(instance: Instance) -> list[str]:
    """Each rule's and family's facts once, with the kernels each fact holds for."""
    by_rule: dict[str, dict[str, list[str]]] = {}
    by_family: dict[str, dict[str, list[str]]] = {}
    for name, k in sorted(instance.manifest["kernels"].items()):
        for fact in k.get("why", {}).get("family", []):
            by_family.setdefault(k["family"], {}).setdefault(fact["text"], []).append(name)
        for rule, facts in k.get("why", {}).get("rules", {}).items():
            for fact in facts:
                by_rule.setdefault(rule, {}).setdefault(fact["text"], []).append(name)
    out = ['<h2 id="legality">Why the chosen kernels are legal</h2>',
           "<p>The legality engine's facts behind every chosen kernel, each said once: under each rule (or family), "
           "the facts it rests on and the kernels each holds for.</p>"]
    for title, groups in (("Families", by_family), ("Rules", by_rule)):
        out.append(f"<h3>{title}</h3>")
        for subject, facts in sorted(groups.items()):
            users = sorted({n for names in facts.values() for n in names})
            out.append(f'<p data-rule="{escape(subject)}"><b>{escape(subject)}</b> '
                       f'<span class="who">({_count(len(users), "kernel")}: {escape(", ".join(users))})</span></p>'
                       '<ul class="facts">')
            for text, names in facts.items():
                who = "" if sorted(names) == users else f' <span class="who">({escape(", ".join(names))})</span>'
                out.append(f"<li>{escape(text)}{who}</li>")
            out.append("</ul>")
    return out


def _figure(f: figs.Figure, wide: bool = False) -> str:
    opening = '<figure class="wide">' if wide else "<figure>"
    return f"{opening}{f.svg}<figcaption>{escape(f.caption)}</figcaption></figure>"


def render(instance: Instance, curves: dict | None, runs: list[bench.Run], hwdb_dir: Path,
           sources: list[str]) -> str:
    top = kernels.ceiling(instance)
    all_kf = kernels.all_figures(instance)
    lab = figs.Lab(instance.realisation)
    body = _header(instance, top) + _summary(all_kf, top)

    body.append('<h2 id="lab">Bandwidth against row length, from the lab</h2>')
    lab_figures = [(kf, figs.lab_chart(lab, kf, top)) for kf in all_kf]
    if instance.realisation is None:
        body.append("<p>The instance carries no realisation profile: the target's lab has not run "
                    "(<code>doit primitives</code> on the GPU writes one).</p>")
    else:
        provenance = lab.provenance
        body.append(f"<p>Every realisation of each operator's legal families that the lab measured on the "
                    f"{escape(provenance.get('device', '?'))} ({escape(provenance.get('date', '?'))}) at a full launch, "
                    "the best at each row length, the chosen kernel's own curve, and the build's timings of the "
                    "kernels it runs at the workload's shapes; the dashed line is the copy ceiling.</p>")
        body.append('<div class="grid">' + "".join(_figure(f) for _, f in lab_figures if f) + "</div>")
        missing = [kf.name for kf, f in lab_figures if f is None]
        if missing:
            body.append(f"<p>Not measured by the lab: {escape(', '.join(missing))}.</p>")

    body.append('<h2 id="details">Each kernel, and the candidates it was chosen over</h2>')
    body.append("<p>Every candidate the build validated and timed, at each workload shape (the fastest valid one "
                "at a shape in bold: the instance runs it there); the geometric mean over the shapes it was timed "
                "at; a candidate that failed, with why.</p>")
    for kf in all_kf:
        body += _kernel_detail(kf, top)
    body += _legality(instance)

    body.append('<h2 id="probes">The probes</h2>')
    if curves:
        body.append("<p>The curves behind the target's measured facts (<code>doit probe</code>), with the knees "
                    "the facts were read from.</p>")
        probes = figs.probe_charts(curves, tables.settings()["knees"], instance.facts)
        body.append('<div class="grid">' + "".join(_figure(f) for _, _, figures in probes for f in figures) + "</div>")
        notes = [(probe, note) for probe, probe_notes, _ in probes for note in probe_notes]
        if notes:
            body.append("<h3>What the probes noted</h3><ul>" + "".join(
                f"<li><b>{escape(probe)}</b>: {escape(note)}</li>" for probe, note in notes) + "</ul>")
    else:
        body.append("<p>No probe curves were found for the target (<code>doit probe</code> on the GPU records "
                    "them).</p>")

    body.append('<h2 id="bench">The latest benchmark against its peers</h2>')
    bench_figures, notes = figs.bench_figures(instance, runs, hwdb_dir)
    body += [f'<p class="note">{escape(n)}</p>' for n in notes]
    body += [_figure(f, wide=True) for f in bench_figures] or ["<p>No benchmark run is recorded.</p>"]

    body.append('<h2 id="sources">Where these figures come from</h2><ul>')
    body += [f"<li><code>{escape(s)}</code></li>" for s in sources] + ["</ul>"]
    body += [f'<p class="note">{escape(n)}</p>' for n in instance.notes]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>aicg instance {escape(instance.name)}</title><style>{STYLE}</style></head>\n<body><main>\n"
            + "\n".join(body) + "\n</main></body></html>\n")
