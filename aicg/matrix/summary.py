"""The matrix family's lines of an instance's summary and report, read from the manifest.

Both are empty for an instance without matrix multiplies, so its summary and
report stay as they were.
"""
from __future__ import annotations

HEADER = ("class", "shape", "kernel", "regs", "smem", "validation", "time", "TFLOP/s", "of peak")


def _rows(manifest: dict) -> list[tuple[str, ...]]:
    section = manifest.get("matrix") or {}
    peaks = section.get("tensor_peak_flops", {})
    out = []
    for name, c in sorted(section.get("classes", {}).items()):
        if not c["dispatch"]:
            out.append((name, "-", "-", "-", "-", "none", "-", "-", "-"))
        for d in c["dispatch"]:
            shape = f"{d['m']}x{d['n']}x{d['k']}"
            k = c["kernels"].get(d["candidate"]) if d["candidate"] else None
            if k is None:
                out.append((name, shape, "-", "-", "-", "none", "-", "-", "-"))
                continue
            r = k["resources"] or {}
            status = d["status"] if d["status"] == "passed" else str(d["status"]).upper()
            seconds = d["measured_seconds"]
            time = f"{seconds * 1e6:.1f} us" if seconds else "-"
            flops = 2 * d["m"] * d["n"] * d["k"] / seconds if seconds else None
            peak = peaks.get(c["dtype"], {}).get("value")
            out.append((name, shape, d["candidate"].removeprefix("matmul."), str(r.get("registers", "?")),
                        f"{r.get('shared_bytes', 0) + k.get('dynamic_shared_bytes', 0)} B", status, time,
                        f"{flops / 1e12:.1f}" if flops else "-", f"{flops / peak:.0%}" if flops and peak else "-"))
    return out


def peak_note(manifest: dict) -> list[str]:
    peaks = (manifest.get("matrix") or {}).get("tensor_peak_flops", {})
    return [f"of peak: TFLOP/s over the tensor cores' {dtype} rate, {p['value'] / 1e12:.1f} TFLOP/s ({p['source']})."
            for dtype, p in sorted(peaks.items())]


def notes(manifest: dict) -> list[str]:
    section = manifest.get("matrix") or {}
    rows = [(name, d) for name, c in sorted(section.get("classes", {}).items()) for d in c["dispatch"]]
    if not rows:
        return []
    found = []
    passed = [d for _, d in rows if d["status"] == "passed"]
    if passed:
        found.append(f"{len(passed)} of {len(rows)} matrix workload shapes run a kernel validated on the target.")
    unvalidated = [f"{name} {d['m']}x{d['n']}x{d['k']}" for name, d in rows if d["status"] not in ("passed",)]
    if unvalidated:
        target = manifest["target"]["name"]
        found.append(f"{len(unvalidated)} of {len(rows)} matrix workload shapes have no kernel validated on {target} "
                     f"(UNVALIDATED or UNVERIFIED: {', '.join(unvalidated[:4])}{', ...' if len(unvalidated) > 4 else ''}): "
                     f"build on such a GPU (or share its cache, or `doit record` there) to validate them; aicg.load "
                     f"refuses them unless allow_unvalidated=True.")
    return found


def table(manifest: dict) -> str:
    """The matrix kernels per class and workload shape, and what the build could not validate ("" without any)."""
    rows = _rows(manifest)
    if not rows:
        return ""
    body = [HEADER, *rows]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + [""] + peak_note(manifest) + notes(manifest)).rstrip() + "\n"


def report(manifest: dict) -> str:
    """report.md's matrix section ("" without matrix multiplies)."""
    section = manifest.get("matrix")
    if not section:
        return ""
    lines = ["## Matrix multiplies", "", f"Compiled for {section['arch']} (compute capability "
                                         f"{'.'.join(map(str, section['compute_capability']))}: they run on such a "
                                         f"GPU only).", "", "```", table(manifest).rstrip(), "```", ""]
    for name, c in sorted(section["classes"].items()):
        lines += [f"### {name}", "", f"Chosen: {c['chosen'] or 'nothing'} ({c['basis']}); {c['considered']} candidates "
                                     f"planned; legal families: {', '.join(c['legal_families']) or 'none'}.",
                  ""]
        for r in c["rejected"]:
            what = r.get("family") or "x".join(map(str, r.get("shape", [])))
            lines.append(f"- left out ({r['by']}): {what}: {r['why']}")
        if c["rejected"]:
            lines.append("")
        lines.append("Why its kernels are legal:")
        for family, facts in sorted(c["why"]["families"].items()):
            lines += [f"- family {family}:"] + [f"  - {f['text']}" for f in facts]
        for rule, facts in sorted(c["why"]["rules"].items()):
            lines += [f"- rule {rule}:"] + [f"  - {f['text']}" for f in facts]
        lines.append("")
    return "\n".join(lines)
