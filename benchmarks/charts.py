"""The headline charts as SVG, drawn from the headline records by :mod:`render_results`.

SVG text written here, not by a plotting library: ``render_results.py --check`` compares the
committed files byte for byte, and a plotting library's SVG changes with its version (ids, path
precision, metadata), which would make the check fail for reasons that are not the figures'.

A record names what it contributes under ``charts``, each entry with ``chart`` and figure names:

- ``{"chart": "peers", "group": "...", "workload": "16 x 128", "figure": NAME}``: one bar of
  kvembed's speed over a peer (a ratio, higher is faster) in the group's cluster;
- ``{"chart": "fidelity", "label": "...", "precision": "int8", "speed": NAME, "cosine": NAME}``: one
  point of speed over PyTorch fp32 against the worst cosine to it.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, Iterable, Mapping

#: chart -> the keys an entry of it must have (besides ``chart``) and which of them name figures
KINDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "peers": (("group", "workload", "figure"), ("figure",)),
    "fidelity": (("label", "precision", "speed", "cosine"), ("speed", "cosine")),
}
WIDTH = 760
FONT = 'font-family="Helvetica, Arial, sans-serif"'
#: one colour per workload (peers) or precision (fidelity), in order of first appearance
PALETTE = ("#3b6fb6", "#e07b39", "#5a9e4b", "#9b59b6", "#c0392b")


def entry_problems(entry: Mapping[str, Any], figures: Mapping[str, Any]) -> list[str]:
    """What a ``charts`` entry of a record lacks: a known chart, its keys, figures the record has."""
    kind = KINDS.get(entry.get("chart"))
    if kind is None:
        return [f"chart entry {entry!r}: chart must be one of {', '.join(KINDS)}"]
    keys, named = kind
    found = [f"chart entry {entry!r} lacks {key}" for key in keys if not entry.get(key)]
    found += [f"chart entry names unknown figure {entry[key]!r}" for key in named if entry.get(key) and entry[key] not in figures]
    return found


def _text(x: float, y: float, text: str, size: int = 12, anchor: str = "start", weight: str = "normal") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" {FONT} '
            f'fill="#222">{escape(text)}</text>')


def _svg(height: float, body: Iterable[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" '
            f'role="img" aria-label="{escape(title)}">\n<rect width="100%" height="100%" fill="#ffffff"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def _colours(names: Iterable[str]) -> dict[str, str]:
    ordered = list(dict.fromkeys(names))
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(ordered)}


def peers_chart(bars: list[tuple[str, str, float]], title: str) -> str:
    """Horizontal bars of ``(group, workload, ratio)``, clustered by group, on a log axis with a
    line at 1x (as fast as the peer)."""
    groups = list(dict.fromkeys(group for group, _, _ in bars))
    colours = _colours(workload for _, workload, _ in bars)
    left, right, top, bar, gap = 300, 60, 56, 14, 16
    top_ratio = max(ratio for _, _, ratio in bars)
    high = 2 ** math.ceil(math.log2(max(top_ratio, 2)))
    low = 0.5
    span = WIDTH - left - right

    def at(ratio: float) -> float:
        return left + span * (math.log2(ratio) - math.log2(low)) / (math.log2(high) - math.log2(low))

    body = [_text(16, 24, title, 15, weight="bold")]
    x = 16.0
    for workload, colour in colours.items():  # legend
        body.append(f'<rect x="{x:.1f}" y="34" width="12" height="12" fill="{colour}"/>')
        body.append(_text(x + 16, 44, workload, 11))
        x += 24 + 7 * len(workload)
    y = float(top)
    for group in groups:
        rows = [(w, r) for g, w, r in bars if g == group]
        height = len(rows) * bar + (len(rows) - 1) * 2
        body.append(_text(left - 8, y + height / 2 + 4, group, 11, anchor="end"))
        for workload, ratio in rows:
            start, end = sorted((at(1), at(ratio)))  # from 1x: right when faster than the peer, left when slower
            body.append(f'<rect x="{start:.1f}" y="{y:.1f}" width="{end - start:.1f}" height="{bar}" fill="{colours[workload]}"/>')
            body.append(_text(end + 4, y + bar - 3, f"{ratio:g}x", 10))
            y += bar + 2
        y += gap
    tick = low
    while tick <= high:
        body.append(f'<line x1="{at(tick):.1f}" y1="{top - 6}" x2="{at(tick):.1f}" y2="{y - gap + 4:.1f}" '
                    f'stroke="{"#555" if tick == 1 else "#ddd"}" stroke-width="{1.5 if tick == 1 else 1}"/>')
        body.append(_text(at(tick), y - gap + 18, f"{tick:g}x", 10, anchor="middle"))
        tick *= 2
    body.append(_text(left + span / 2, y - gap + 34, "kvembed's speed over the peer (log scale; 1x = as fast)", 11, anchor="middle"))
    return _svg(y - gap + 46, body, title)


def fidelity_chart(points: list[tuple[str, str, float, float]], title: str) -> str:
    """Points of ``(label, precision, speed, cosine)``: speed over PyTorch fp32 up, distance from
    fp32 (1 - worst cosine, log scale) across, so faster and more faithful is up and to the left."""
    colours = _colours(precision for _, precision, _, _ in points)
    left, right, top, height = 70, 220, 80, 260
    lows = [1 - cosine for _, _, _, cosine in points]
    x_low = 10 ** math.floor(math.log10(max(min(lows), 1e-7)))
    x_high = 10 ** math.ceil(math.log10(max(lows)))
    x_high = max(x_high, x_low * 100)
    y_high = math.ceil(max(speed for _, _, speed, _ in points)) + 1
    span = WIDTH - left - right

    def at_x(distance: float) -> float:
        return left + span * (math.log10(max(distance, x_low)) - math.log10(x_low)) / (math.log10(x_high) - math.log10(x_low))

    def at_y(speed: float) -> float:
        return top + height - height * speed / y_high

    body = [_text(16, 24, title, 15, weight="bold")]
    x = 16.0
    for precision, colour in colours.items():
        body.append(f'<circle cx="{x + 6:.1f}" cy="40" r="5" fill="{colour}"/>')
        body.append(_text(x + 16, 44, precision, 11))
        x += 30 + 7 * len(precision)
    body.append(f'<line x1="{left}" y1="{top + height}" x2="{left + span}" y2="{top + height}" stroke="#555"/>')
    body.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#555"/>')
    decade = x_low
    while decade <= x_high * 1.0001:
        body.append(f'<line x1="{at_x(decade):.1f}" y1="{top}" x2="{at_x(decade):.1f}" y2="{top + height}" stroke="#eee"/>')
        body.append(_text(at_x(decade), top + height + 16, f"{decade:g}", 10, anchor="middle"))
        decade *= 10
    for speed in range(0, int(y_high) + 1):
        body.append(f'<line x1="{left}" y1="{at_y(speed):.1f}" x2="{left + span}" y2="{at_y(speed):.1f}" stroke="#eee"/>')
        body.append(_text(left - 8, at_y(speed) + 4, f"{speed}x", 10, anchor="end"))
    body.append(f'<line x1="{left}" y1="{at_y(1):.1f}" x2="{left + span}" y2="{at_y(1):.1f}" stroke="#555" stroke-dasharray="4 3"/>')
    for label, precision, speed, cosine in points:
        cx, cy = at_x(1 - cosine), at_y(speed)
        body.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colours[precision]}"/>')
        body.append(_text(cx + 8, cy + 4, f"{label} ({speed:g}x, {cosine:g})", 10))
    body.append(_text(left + span / 2, top + height + 34, "1 - worst cosine to PyTorch fp32 (log scale; left = more faithful)", 11,
                      anchor="middle"))
    body.append(_text(16, top - 14, "speed over PyTorch fp32 (SmolLM2-135M unless named)", 11))
    return _svg(top + height + 46, body, title)


def render_charts(records: list[tuple[Any, Mapping[str, Any]]]) -> dict[str, str]:
    """``{file name: SVG}`` of every chart the records contribute to."""
    bars: list[tuple[str, str, float]] = []
    points: list[tuple[str, str, float, float]] = []
    for _, data in records:
        figures = data["figures"]
        for entry in data.get("charts") or []:
            if entry["chart"] == "peers":
                bars.append((entry["group"], entry["workload"], float(figures[entry["figure"]]["value"])))
            else:
                points.append((entry["label"], entry["precision"], float(figures[entry["speed"]]["value"]),
                               float(figures[entry["cosine"]]["value"])))
    charts = {}
    if bars:
        charts["peers.svg"] = peers_chart(bars, "kvembed against its peers, per workload")
    if points:
        charts["fidelity.svg"] = fidelity_chart(points, "Speed against fidelity, per precision")
    return charts
