"""Small SVG charts for the report: series on linear or log axes with reference lines, and a dot
plot of contenders per case.

The page carries no script and loads nothing, so the charts are drawn here, as plain SVG
elements with their colours written on them (a chart copied out of the page looks the same).
Every chart's plotting area is filled with PLOT_BACKGROUND: a reader's eye finds the data on it,
and a test finds the plots in a screenshot by it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Callable

PLOT_BACKGROUND = "#f1f4f9"
GRID = "#d9dee8"
AXIS = "#59606e"
TEXT = "#1f2430"
FONT = "font-family=\"system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif\""
CHAR_WIDTH = 6.2   # px per character at 11 px: enough to keep labels apart, not a measurement

# Okabe and Ito's palette: told apart with every common colour-vision deficiency
BLUE, ORANGE, GREEN, VERMILION, PURPLE, SKY, YELLOW, GREY = (
    "#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#8d94a0")


@dataclass(frozen=True)
class Scale:
    lo: float
    hi: float
    log: bool = False

    def frac(self, value: float) -> float:
        if self.log:
            return (math.log(value) - math.log(self.lo)) / (math.log(self.hi) - math.log(self.lo))
        return (value - self.lo) / (self.hi - self.lo)

    def ticks(self, most: int = 8) -> list[float]:
        if self.log:
            # powers of two where the span is small, of ten where it is wide
            base = 2.0 if self.hi / self.lo <= 2.0 ** 20 else 10.0
            first, last = math.ceil(math.log(self.lo, base) - 1e-9), math.floor(math.log(self.hi, base) + 1e-9)
            powers = list(range(first, last + 1))
            step = max(1, math.ceil(len(powers) / most))
            return [base ** p for p in powers[::step]]
        raw = (self.hi - self.lo) / max(1, most - 1)
        magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
        step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
        start = math.ceil(self.lo / step - 1e-9) * step
        return [start + i * step for i in range(int((self.hi - start) / step + 1e-9) + 1)]


def scale_of(values, log: bool, floor_zero: bool = False, headroom: float = 0.06) -> Scale:
    """A scale holding every value, with a little room above; from zero where floor_zero."""
    values = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log)]
    if not values:
        return Scale(1.0, 10.0, log)
    lo, hi = min(values), max(values)
    if log:
        lo, hi = lo / 1.25, hi * 1.25
        return Scale(lo, hi if hi > lo else lo * 10, True)
    lo = 0.0 if floor_zero else lo
    span = (hi - lo) or abs(hi) or 1.0
    return Scale(lo, hi + span * headroom, False)


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]
    colour: str
    kind: str = "line"          # "line", "dots" (a cloud of small points) or "markers" (large, unjoined)
    dashed: bool = False


@dataclass(frozen=True)
class Rule:
    """A reference line across the plot: a ceiling (axis "y") or a knee (axis "x")."""
    label: str
    value: float
    axis: str
    colour: str = TEXT


def number(value: float) -> str:
    """A tick label: short, exact where the value is a whole number."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        exponent = math.floor(math.log10(abs(value)))
        mantissa = value / 10 ** exponent
        return f"{number(round(mantissa, 2))}e{exponent}"
    if abs(value) >= 1 and float(value).is_integer():
        return f"{int(value)}"
    return f"{value:.3g}"


def binary_size(value: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if value >= size:
            return f"{number(round(value / size, 2))} {unit}"
    return f"{number(value)} B"


def _text(x, y, body, anchor="start", size=11, colour=TEXT, weight="normal", extra="") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{colour}" '
            f'font-weight="{weight}" {FONT}{extra}>{escape(body)}</text>')


def _marker(x: float, y: float, colour: str, shape: str, size: float = 4.5) -> str:
    if shape == "diamond":
        return (f'<path d="M{x:.1f} {y - size:.1f} L{x + size:.1f} {y:.1f} L{x:.1f} {y + size:.1f} '
                f'L{x - size:.1f} {y:.1f} Z" fill="{colour}" stroke="#ffffff" stroke-width="1"/>')
    if shape == "square":
        return (f'<rect x="{x - size + 0.8:.1f}" y="{y - size + 0.8:.1f}" width="{2 * size - 1.6:.1f}" '
                f'height="{2 * size - 1.6:.1f}" fill="{colour}" stroke="#ffffff" stroke-width="1"/>')
    if shape == "triangle":
        return (f'<path d="M{x:.1f} {y - size:.1f} L{x + size:.1f} {y + size * 0.8:.1f} '
                f'L{x - size:.1f} {y + size * 0.8:.1f} Z" fill="{colour}" stroke="#ffffff" stroke-width="1"/>')
    if shape == "bar":
        return f'<rect x="{x - 1.5:.1f}" y="{y - size - 1:.1f}" width="3" height="{2 * size + 2:.1f}" fill="{colour}"/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size - 0.5:.1f}" fill="{colour}" stroke="#ffffff" stroke-width="1"/>'


def _legend(entries: list[tuple[str, str, str]], left: float, top: float, width: float) -> tuple[list[str], float]:
    """(elements, height) of a legend that wraps: entries are (label, colour, how drawn)."""
    out, x, y = [], left, top + 10
    fits = int((width - 40) / CHAR_WIDTH)
    for label, colour, how in entries:
        label = label if len(label) <= fits else label[:fits - 1] + "…"
        need = 26 + len(label) * CHAR_WIDTH + 14
        if x > left and x + need > left + width:
            x, y = left, y + 16
        if how == "line":
            out.append(f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 20:.1f}" y2="{y - 4:.1f}" stroke="{colour}" '
                       f'stroke-width="2.5"/>')
        elif how == "dashed":
            out.append(f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 20:.1f}" y2="{y - 4:.1f}" stroke="{colour}" '
                       f'stroke-width="1.5" stroke-dasharray="5 3"/>')
        elif how == "dots":
            out.append(f'<circle cx="{x + 10:.1f}" cy="{y - 4:.1f}" r="2" fill="{colour}" fill-opacity="0.55"/>')
        else:
            out.append(_marker(x + 10, y - 4, colour, how))
        out.append(_text(x + 26, y, label, size=10.5))
        x += need
    return out, y - top + 6


def chart(title: str, series: list[Series], rules: list[Rule], x_label: str, y_label: str, *,
          x_log: bool = False, y_log: bool = False, y_from_zero: bool = True,
          x_format: Callable[[float], str] = number, y_format: Callable[[float], str] = number,
          width: int = 350, height: int = 240, name: str = "") -> str:
    """Series against one x and one y scale, with reference lines and a legend below the plot."""
    xs = [x for s in series for x, _ in s.points] + [r.value for r in rules if r.axis == "x"]
    ys = [y for s in series for _, y in s.points] + [r.value for r in rules if r.axis == "y"]
    x_scale, y_scale = scale_of(xs, x_log), scale_of(ys, y_log, floor_zero=y_from_zero and not y_log)
    left, right, top = 58, 12, 30
    plot_w, plot_h = width - left - right, height - top - 42
    legend_entries = [(s.label, s.colour, {"line": "dashed" if s.dashed else "line", "dots": "dots",
                                           "markers": "diamond"}[s.kind]) for s in series]
    legend_entries += [(r.label, r.colour, "dashed") for r in rules]
    legend, legend_h = _legend(legend_entries, left - 40, top + plot_h + 34, plot_w + 40)
    total_h = top + plot_h + 34 + legend_h

    def px(x: float) -> float:
        return left + x_scale.frac(x) * plot_w

    def py(y: float) -> float:
        return top + plot_h - y_scale.frac(y) * plot_h

    out = [f'<svg class="chart" data-chart="{escape(name)}" width="{width}" '
           f'height="{total_h:.0f}" viewBox="0 0 {width} {total_h:.0f}" role="img" aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>",
           _text(left - 40, 16, title, size=12.5, weight="600"),
           f'<rect class="plot-area" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="{PLOT_BACKGROUND}"/>']
    for tick in y_scale.ticks(6):
        if y_scale.lo <= tick <= y_scale.hi:
            out.append(f'<line x1="{left}" y1="{py(tick):.1f}" x2="{left + plot_w}" y2="{py(tick):.1f}" '
                       f'stroke="{GRID}" stroke-width="1"/>')
            out.append(_text(left - 6, py(tick) + 3.5, y_format(tick), anchor="end", size=10, colour=AXIS))
    for tick in x_scale.ticks(7):
        if x_scale.lo <= tick <= x_scale.hi:
            out.append(f'<line x1="{px(tick):.1f}" y1="{top}" x2="{px(tick):.1f}" y2="{top + plot_h}" '
                       f'stroke="{GRID}" stroke-width="1"/>')
            out.append(_text(px(tick), top + plot_h + 14, x_format(tick), anchor="middle", size=10, colour=AXIS))
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="{AXIS}" '
               f'stroke-width="1"/>')
    out.append(_text(left + plot_w / 2, top + plot_h + 28, x_label, anchor="middle", size=10.5, colour=AXIS))
    out.append(_text(14, top + plot_h / 2, y_label, anchor="middle", size=10.5, colour=AXIS,
                     extra=f' transform="rotate(-90 14 {top + plot_h / 2:.1f})"'))
    for rule in rules:
        if rule.axis == "y":
            out.append(f'<line x1="{left}" y1="{py(rule.value):.1f}" x2="{left + plot_w}" y2="{py(rule.value):.1f}" '
                       f'stroke="{rule.colour}" stroke-width="1.5" stroke-dasharray="5 3"/>')
        else:
            out.append(f'<line x1="{px(rule.value):.1f}" y1="{top}" x2="{px(rule.value):.1f}" y2="{top + plot_h}" '
                       f'stroke="{rule.colour}" stroke-width="1.5" stroke-dasharray="5 3"/>')
    for s in series:
        points = sorted(s.points)
        if s.kind == "dots":
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2" fill="{s.colour}" fill-opacity="0.55"/>'
                    for x, y in points]
        elif s.kind == "markers":
            out += [_marker(px(x), py(y), s.colour, "diamond", 5.5) for x, y in points]
        else:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
            dash = ' stroke-dasharray="6 3"' if s.dashed else ""
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" stroke-width="2.5" '
                       f'stroke-linejoin="round"{dash}/>')
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.8" fill="{s.colour}"/>' for x, y in points]
    out += legend
    out.append("</svg>")
    return "\n".join(out)


@dataclass(frozen=True)
class Contender:
    name: str
    colour: str
    shape: str      # "circle", "diamond", "square", "triangle" or "bar"


def dot_plot(title: str, cases: list[tuple[str, dict[str, float]]], contenders: list[Contender], x_label: str, *,
             rules: list[Rule] = (), width: int = 1000, name: str = "") -> str:
    """One row per case, a marker per contender at its value: many cases against their peers at a glance."""
    label_w = max([len(label) for label, _ in cases] + [10]) * CHAR_WIDTH + 16
    left, right, top, row_h = label_w, 16, 30, 17
    plot_w, plot_h = width - left - right, row_h * len(cases) + 6
    values = [v for _, row in cases for v in row.values()] + [r.value for r in rules]
    x_scale = scale_of(values, False, floor_zero=True)
    legend, legend_h = _legend([(c.name, c.colour, c.shape) for c in contenders]
                               + [(r.label, r.colour, "dashed") for r in rules], left, top + plot_h + 32, plot_w)
    total_h = top + plot_h + 32 + legend_h

    def px(x: float) -> float:
        return left + x_scale.frac(x) * plot_w

    out = [f'<svg class="chart" data-chart="{escape(name)}" width="{width}" '
           f'height="{total_h:.0f}" viewBox="0 0 {width} {total_h:.0f}" role="img" aria-label="{escape(title)}">',
           f"<title>{escape(title)}</title>", _text(8, 16, title, size=12.5, weight="600"),
           f'<rect class="plot-area" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="{PLOT_BACKGROUND}"/>']
    for tick in x_scale.ticks(8):
        out.append(f'<line x1="{px(tick):.1f}" y1="{top}" x2="{px(tick):.1f}" y2="{top + plot_h}" stroke="{GRID}"/>')
        out.append(_text(px(tick), top + plot_h + 14, number(tick), anchor="middle", size=10, colour=AXIS))
    out.append(_text(left + plot_w / 2, top + plot_h + 27, x_label, anchor="middle", size=10.5, colour=AXIS))
    for i, (label, row) in enumerate(cases):
        y = top + 3 + row_h * i + row_h / 2
        if i % 2:
            out.append(f'<rect x="{left}" y="{y - row_h / 2:.1f}" width="{plot_w}" height="{row_h}" '
                       f'fill="#ffffff" fill-opacity="0.45"/>')
        out.append(_text(left - 8, y + 3.5, label, anchor="end", size=10.5))
        known = [row[c.name] for c in contenders if c.name in row]
        if known:
            out.append(f'<line x1="{px(min(known)):.1f}" y1="{y:.1f}" x2="{px(max(known)):.1f}" y2="{y:.1f}" '
                       f'stroke="{GRID}" stroke-width="2"/>')
        out += [_marker(px(row[c.name]), y, c.colour, c.shape) for c in contenders if c.name in row]
    for rule in rules:
        out.append(f'<line x1="{px(rule.value):.1f}" y1="{top}" x2="{px(rule.value):.1f}" y2="{top + plot_h}" '
                   f'stroke="{rule.colour}" stroke-width="1.5" stroke-dasharray="5 3"/>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="{AXIS}"/>')
    out += legend
    out.append("</svg>")
    return "\n".join(out)
