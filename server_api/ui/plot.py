"""Participation and duration per round as an inline SVG chart, drawn on the server.

Bars (left axis, devices): selected, with the uploaded part drawn over it, red for a failed round.
Line (right axis): the round's duration from opening to its end. Oldest round on the left.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from facecore.federation.status import RoundStatus
from server_api.ui.view import RoundRow

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 48, 56, 34, 36


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= value: readable axis ends."""
    if value <= 0:
        return 1.0
    scale = 10 ** len(str(int(value))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def _seconds(value: float) -> str:
    return f"{value / 60:.0f} min" if value >= 600 else f"{value:.0f} s"


def participation_svg(rounds: Sequence[RoundRow]) -> str:
    """The chart for ``rounds`` (any order); a short note instead when there is none."""
    ordered = sorted(rounds, key=lambda r: r.id)
    if not ordered:
        return '<p class="empty">No round yet: the chart appears after the first one opens.</p>'
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    devices_max = _nice_ceiling(max(max(r.n_selected, r.n_uploaded, r.target) for r in ordered))
    seconds_max = _nice_ceiling(max(r.duration_s for r in ordered))
    slot = plot_w / len(ordered)
    bar = max(2.0, min(28.0, slot * 0.6))

    def y_devices(n: float) -> float:
        return TOP + plot_h * (1 - n / devices_max)

    def y_seconds(s: float) -> float:
        return TOP + plot_h * (1 - s / seconds_max)

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        'xmlns="http://www.w3.org/2000/svg" aria-labelledby="chart-title">',
        '<title id="chart-title">Participants and duration per round</title>',
    ]
    for fraction in (0, 0.5, 1):  # grid and both axes' labels
        y = TOP + plot_h * (1 - fraction)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{devices_max * fraction:g}</text>'
        )
        parts.append(
            f'<text class="axis" x="{LEFT + plot_w + 6}" y="{y + 4:.1f}">{_seconds(seconds_max * fraction)}</text>'
        )
    parts.append(f'<text class="axis" x="{LEFT - 6}" y="{TOP - 10}" text-anchor="end">devices</text>')
    parts.append(f'<text class="axis" x="{LEFT + plot_w + 6}" y="{TOP - 10}">duration</text>')
    label_every = max(1, round(len(ordered) / 20))
    points = []
    for i, r in enumerate(ordered):
        x = LEFT + slot * (i + 0.5)
        tip = escape(
            f"round {r.id} ({r.status}): {r.n_uploaded} uploaded, {r.n_selected} selected, "
            f"{r.n_checked_in} checked in, "
            f"target {r.target}; {_seconds(r.duration_s)}"
        )
        parts.append(f"<g><title>{tip}</title>")
        parts.append(
            f'<rect class="selected" x="{x - bar / 2:.1f}" y="{y_devices(r.n_selected):.1f}" width="{bar:.1f}" '
            f'height="{TOP + plot_h - y_devices(r.n_selected):.1f}"/>'
        )
        kind = "failed" if r.status == RoundStatus.FAILED else "uploaded"  # CSS classes
        parts.append(
            f'<rect class="{kind}" x="{x - bar / 2:.1f}" y="{y_devices(r.n_uploaded):.1f}" width="{bar:.1f}" '
            f'height="{TOP + plot_h - y_devices(r.n_uploaded):.1f}"/></g>'
        )
        if i % label_every == 0:
            parts.append(f'<text class="axis" x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{r.id}</text>')
        points.append((x, y_seconds(r.duration_s)))
    parts.append(f'<text class="axis" x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 4}" text-anchor="middle">round</text>')
    parts.append('<polyline class="duration" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
    parts.extend(f'<circle class="duration" cx="{x:.1f}" cy="{y:.1f}" r="3"/>' for x, y in points)
    legend = (("selected", "selected"), ("uploaded", "uploaded"), ("failed", "uploaded, round failed"))
    for i, (kind, text) in enumerate(legend):
        x = LEFT + i * 150
        parts.append(
            f'<rect class="{kind}" x="{x}" y="6" width="12" height="12"/>'
            f'<text class="axis" x="{x + 18}" y="16">{text}</text>'
        )
    x = LEFT + len(legend) * 150
    parts.append(
        f'<line class="duration" x1="{x}" x2="{x + 14}" y1="12" y2="12"/>'
        f'<text class="axis" x="{x + 20}" y="16">duration</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)
