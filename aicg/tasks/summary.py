"""The instance summary: one row per operator and dtype, read from the manifest."""
from __future__ import annotations

HEADER = ("op", "dtype", "legal families", "chosen", "params", "regs", "smem", "spills", "validation", "time")


def _params(p: dict) -> str:
    text = f"t{p['threads']} v{p['vec_bytes']}B {p['topology']}"
    return text + (" fast-exp" if p.get("fast_exp") else "")


def rows(manifest: dict) -> list[tuple[str, ...]]:
    out = []
    for name, k in sorted(manifest["kernels"].items()):
        r = k["resources"]
        known = r.get("reported", True)   # "?": NVRTC's log held no ptxas report
        spills = f"{r['spill_store_bytes'] + r['spill_load_bytes']} B" if known else "?"
        time = f"{k['measured_seconds'] * 1e6:.1f} us" if k.get("measured_seconds") else "-"
        status = k["validation"] if k["validation"] == "passed" else k["validation"].upper()
        out.append((k["op"], k["dtype"], f"{len(k['legal_families'])} ({k['considered']} cand.)", k["family"],
                    _params(k["params"]), str(r["registers"]) if known else "?", f"{r['shared_bytes']} B", spills,
                    status, time))
    for name, reason in sorted(manifest["unavailable"].items()):
        op, dtype = name.split(".", 1)
        out.append((op, dtype, "0", "-", "-", "-", "-", "-", "none", "-"))
    return out


def table(manifest: dict) -> str:
    """The row kernels' table and notes, then the matrix kernels' (aicg/matrix/summary.py) where there are any."""
    from ..matrix import summary as matrix_summary
    matrix = matrix_summary.table(manifest)
    if not manifest["kernels"]:
        return matrix
    return _rows_table(manifest) + (f"\n{matrix}" if matrix else "")


def _rows_table(manifest: dict) -> str:
    body = [HEADER, *rows(manifest)]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in body]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = []
    kernels, total = manifest["kernels"], len(manifest["kernels"])
    by_device: dict[str, int] = {}
    for k in kernels.values():
        if k["validation"] == "passed":
            device = k.get("validated_on") or manifest["target"]["name"]
            by_device[device] = by_device.get(device, 0) + 1
    if by_device:
        notes.append(f"{sum(by_device.values())} of {total} kernels validated on "
                     + ", ".join(f"{device}" if n == sum(by_device.values()) else f"{device} ({n})"
                                 for device, n in sorted(by_device.items())) + ".")
    unverified = [n for n, k in kernels.items() if k["validation"] == "unverified"]
    if unverified:
        notes.append(f"{len(unverified)} of {total} kernels are UNVERIFIED: their validations came from an unsigned "
                     f"remote store, which is not trusted; set AICG_SIGNING_KEY_FILE to the key the GPU nodes sign with "
                     f"(or build on a {manifest['target']['name']}) to verify them. aicg.load refuses them unless "
                     f"allow_unvalidated=True.")
    unvalidated = [n for n, k in kernels.items() if k["validation"] not in ("passed", "unverified")]
    if unvalidated:
        which = "" if len(unvalidated) == total else f" ({', '.join(sorted(unvalidated))})"
        notes.append(f"{len(unvalidated)} of {total} kernels are UNVALIDATED{which}: no validation of "
                     f"these cubins on {manifest['target']['name']} was found; build on such a GPU (or share its cache, "
                     f"or `doit record` there) to validate them.")
    for name, reason in sorted(manifest["unavailable"].items()):
        notes.append(f"{name}: {reason}")
    prior = manifest.get("prior")
    if prior and prior["kernels_changed"] is None:
        notes.append(f"The plan's prior, {prior['profile']} ({prior['device']}, {prior['date']}), does not record "
                     f"which kernels it measured; `doit primitives` on the target measures the current ones.")
    elif prior and prior["kernels_changed"]:
        notes.append(f"The plan's prior, {prior['profile']} ({prior['device']}, {prior['date']}), measured kernels "
                     f"that have changed since: {', '.join(prior['kernels_changed'])}; its ranking may be stale "
                     f"until `doit primitives` runs on the target.")
    return "\n".join(lines + [""] + notes).rstrip() + "\n"


def _kept(variant: dict) -> str:
    longest = variant.get("longest_row")
    return "" if longest is None else f" (its order keeps the bound on rows of at most {longest} elements)"


def report(manifest: dict) -> str:
    lines = [f"# aicg instance {manifest['instance']}", "",
             f"Target: {manifest['target']['name']} ({manifest['target']['arch']}); preservation preset "
             f"{manifest['preservation']['preset']!r}: " +
             ", ".join(f"{k} = {v!r}" for k, v in sorted(manifest['preservation']['axes'].items())) + ".",
             "Toolchain: " + ", ".join(f"{k} {v}" for k, v in sorted(manifest["toolchain"].items())) + ".", "",
             "```", table(manifest).rstrip(), "```", ""]
    for name, k in sorted(manifest["kernels"].items()):
        lines += [f"## {name}: {k['candidate']}", "", f"Chosen: {k['basis']}.", ""]
        if k.get("dispatch"):
            lines += ["Per workload shape:"] + [f"- {v['rows']}x{v['cols']}: {v['candidate']}" + _kept(v)
                                                for v in k["dispatch"]] + [""]
        lines += ["Why this family is legal:"]
        lines += [f"- {fact['text']}" for fact in k["why"]["family"]]
        for rule, facts in sorted(k["why"]["rules"].items()):
            lines += [f"- rule {rule}:"] + [f"  - {fact['text']}" for fact in facts]
        lines.append("")
    return "\n".join(lines)
