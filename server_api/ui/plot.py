"""The operator page's charts as inline SVG, drawn on the server (no script: the page's CSP allows none).

Four small charts, each a function of the rows `view` read, all with the oldest round or version on the left:
- uploads against target: per round, the selected devices (light bar), the uploaded ones over it (red for a
  failed round), the target as a solid tick and the minimum as a dashed one;
- duration: per round, opening to end (to now while active) as a line, the configured deadline as a dashed tick;
- what a round changed: per completed round, the L2 norm of the published backbone minus its base;
- verification threshold: per model version, its published threshold; a hollow point is a round's version
  still publishing its parent's threshold, a filled one a threshold calibrated for that version.

Invariants: every text from the database passes through `escape`; every data mark is a `<g class="mark">`
carrying its value in `data-value` and a `<title>` tooltip that spells it out, so a browser test reads what
was drawn; the three round charts share one x slot per round, so a round sits at the same place in each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from facecore.federation.status import RoundStatus
from server_api.ui.view import RoundRow, VersionRow

WIDTH, HEIGHT = 600, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 30, 34
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
NO_ROUND = '<p class="empty">No round yet: the charts appear after the first one opens.</p>'


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= value: readable axis ends, for small values too."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    scale = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5):
        if step * scale >= value * (1 - 1e-12):
            return float(f"{step * scale:.12g}")
    return float(f"{10 * scale:.12g}")


def _seconds(value: float) -> str:
    return f"{value / 60:.0f} min" if value >= 600 else f"{value:.0f} s"


def _norm(value: float) -> str:
    return f"{value:.4g}"


class _Chart:
    """One chart's frame: a left axis from `low` to `high`, `slots` x positions, a legend along the top."""

    def __init__(
        self, chart_id: str, title: str, slots: int, low: float, high: float, axis_text: Callable[[float], str],
        axis_name: str,
    ) -> None:
        self.low, self.high, self.slot = low, high, PLOT_W / max(1, slots)
        self.bar = max(2.0, min(28.0, self.slot * 0.6))
        self.parts = [
            f'<svg class="chart" id="{chart_id}" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg" aria-labelledby="{chart_id}-title">',
            f'<title id="{chart_id}-title">{escape(title)}</title>',
        ]
        for fraction in (0, 0.5, 1):
            y = TOP + PLOT_H * (1 - fraction)
            self.parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}"/>')
            self.parts.append(
                f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                f"{escape(axis_text(low + (high - low) * fraction))}</text>"
            )
        self.parts.append(f'<text class="axis" x="{LEFT - 6}" y="{TOP - 12}" text-anchor="end">{escape(axis_name)}</text>')
        self._legend_x = float(LEFT)

    def x(self, i: int) -> float:
        return LEFT + self.slot * (i + 0.5)

    def y(self, value: float) -> float:
        clamped = min(max(value, self.low), self.high)
        return TOP + PLOT_H * (1 - (clamped - self.low) / (self.high - self.low))

    def floor(self) -> float:
        return TOP + PLOT_H

    def x_labels(self, labels: Sequence[str], name: str) -> None:
        every = max(1, round(len(labels) / 16))
        for i, label in enumerate(labels):
            if i % every == 0:
                self.parts.append(
                    f'<text class="axis" x="{self.x(i):.1f}" y="{TOP + PLOT_H + 15}" text-anchor="middle">{escape(label)}</text>'
                )
        self.parts.append(f'<text class="axis" x="{LEFT + PLOT_W / 2:.1f}" y="{HEIGHT - 3}" text-anchor="middle">{name}</text>')

    def mark(self, value: float, tip: str, shapes: str) -> None:
        self.parts.append(f'<g class="mark" data-value="{value!r}"><title>{escape(tip)}</title>{shapes}</g>')

    def legend(self, swatch: str, text: str) -> None:
        """`swatch` is drawn with its own x at 0: it is moved into place."""
        x = self._legend_x
        self.parts.append(
            f'<g class="legend" transform="translate({x:.0f},0)">{swatch}'
            f'<text class="axis" x="18" y="16">{escape(text)}</text></g>'
        )
        self._legend_x += 22 + 6.5 * len(text)

    def render(self) -> str:
        return "\n".join([*self.parts, "</svg>"])


def _bar(kind: str, x: float, top: float, bottom: float, width: float) -> str:
    return f'<rect class="{kind}" x="{x - width / 2:.1f}" y="{top:.1f}" width="{width:.1f}" height="{max(0.0, bottom - top):.1f}"/>'


def _tick(kind: str, x: float, y: float, width: float) -> str:
    return f'<line class="{kind}" x1="{x - width / 2 - 3:.1f}" x2="{x + width / 2 + 3:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>'


def uploads_svg(rounds: Sequence[RoundRow]) -> str:
    """Selected and uploaded devices per round, against its target and minimum."""
    ordered = sorted(rounds, key=lambda r: r.id)
    top = _nice_ceiling(max(max(r.n_selected, r.n_uploaded, r.target) for r in ordered))
    chart = _Chart("chart-uploads", "Uploads against target per round", len(ordered), 0, top, lambda v: f"{v:g}", "devices")
    for i, r in enumerate(ordered):
        x, kind = chart.x(i), "failed" if r.status == RoundStatus.FAILED else "uploaded"  # CSS classes
        tip = (
            f"round {r.id} ({r.status}): {r.n_uploaded} uploaded of target {r.target} (minimum {r.minimum}); "
            f"{r.n_selected} selected, {r.n_checked_in} checked in"
        )
        chart.mark(r.n_uploaded, tip, (
            _bar("selected", x, chart.y(r.n_selected), chart.floor(), chart.bar)
            + _bar(kind, x, chart.y(r.n_uploaded), chart.floor(), chart.bar)
            + _tick("target", x, chart.y(r.target), chart.bar)
            + _tick("minimum", x, chart.y(r.minimum), chart.bar)
        ))
    chart.x_labels([str(r.id) for r in ordered], "round")
    chart.legend('<rect class="selected" x="0" y="6" width="12" height="12"/>', "selected")
    chart.legend('<rect class="uploaded" x="0" y="6" width="12" height="12"/>', "uploaded")
    chart.legend('<rect class="failed" x="0" y="6" width="12" height="12"/>', "uploaded, round failed")
    chart.legend('<line class="target" x1="0" x2="14" y1="12" y2="12"/>', "target")
    chart.legend('<line class="minimum" x1="0" x2="14" y1="12" y2="12"/>', "minimum")
    return chart.render()


def duration_svg(rounds: Sequence[RoundRow]) -> str:
    """Each round's duration (so far, while active) against its configured deadline."""
    ordered = sorted(rounds, key=lambda r: r.id)
    top = _nice_ceiling(max(max(r.duration_s, r.deadline_s) for r in ordered))
    chart = _Chart("chart-duration", "Duration per round", len(ordered), 0, top, _seconds, "duration")
    points = [(chart.x(i), chart.y(r.duration_s)) for i, r in enumerate(ordered)]
    chart.parts.append('<polyline class="duration" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
    for (x, y), r in zip(points, ordered):
        so_far = " so far" if r.active else ""
        tip = f"round {r.id} ({r.status}): {_seconds(r.duration_s)}{so_far}, deadline {_seconds(r.deadline_s)}"
        chart.mark(r.duration_s, tip, (
            _tick("deadline", x, chart.y(r.deadline_s), chart.bar)
            + f'<circle class="duration{" active" if r.active else ""}" cx="{x:.1f}" cy="{y:.1f}" r="3.5"/>'
        ))
    chart.x_labels([str(r.id) for r in ordered], "round")
    chart.legend('<line class="duration" x1="0" x2="14" y1="12" y2="12"/>', "opening to end")
    chart.legend('<line class="deadline" x1="0" x2="14" y1="12" y2="12"/>', "deadline")
    return chart.render()


def change_svg(rounds: Sequence[RoundRow]) -> str:
    """What each completed round changed: the L2 norm of its published backbone minus its base."""
    ordered = sorted(rounds, key=lambda r: r.id)
    norms = [r.change_norm for r in ordered if r.change_norm is not None]
    top = _nice_ceiling(max(norms, default=0.0))
    chart = _Chart("chart-change", "Backbone change per round", len(ordered), 0, top, lambda v: f"{v:g}", "L2 norm")
    for i, r in enumerate(ordered):
        if r.change_norm is None:
            continue  # failed, still running, or aggregated before the norm was recorded: nothing published
        loss = f"; devices' mean loss {r.metrics['loss']:.4g}" if "loss" in r.metrics else ""
        tip = f"round {r.id}: backbone moved by {_norm(r.change_norm)} (L2 norm of new minus base){loss}"
        chart.mark(r.change_norm, tip, _bar("change", chart.x(i), chart.y(r.change_norm), chart.floor(), chart.bar))
    if not norms:
        chart.parts.append(
            f'<text class="axis" x="{LEFT + PLOT_W / 2:.1f}" y="{TOP + PLOT_H / 2:.1f}" text-anchor="middle">'
            "no completed round yet</text>"
        )
    chart.x_labels([str(r.id) for r in ordered], "round")
    chart.legend('<rect class="change" x="0" y="6" width="12" height="12"/>', "L2 norm of the published change")
    return chart.render()


def _threshold_range(values: Sequence[float]) -> tuple[float, float]:
    """An axis around the thresholds, not from 0: they differ in the second or third decimal."""
    low, high = min(values), max(values)
    pad = max(0.01, (high - low) * 0.2)
    return max(-1.0, math.floor((low - pad) * 100) / 100), min(1.0, math.ceil((high + pad) * 100) / 100)


def threshold_svg(versions: Sequence[VersionRow]) -> str:
    """Each version's published verification threshold, oldest version on the left."""
    ordered = sorted(versions, key=lambda v: v.created_at)
    shown = [(i, v) for i, v in enumerate(ordered) if v.threshold is not None]
    if not shown:
        return '<p class="empty">No version publishes a verification threshold.</p>'
    low, high = _threshold_range([v.threshold for _, v in shown if v.threshold is not None])
    chart = _Chart("chart-threshold", "Verification threshold per model version", len(ordered), low, high,
                   lambda v: f"{v:.3f}", "cosine")
    points = [(chart.x(i), chart.y(v.threshold)) for i, v in shown if v.threshold is not None]
    chart.parts.append('<polyline class="threshold" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
    for (x, y), (_, v) in zip(points, shown):
        assert v.threshold is not None
        origin = f"round {v.round_id}" if v.round_id is not None else "initial model"
        how = "inherited from its parent" if v.threshold_inherited else "calibrated for it"
        far = f" at FAR {v.far:g}" if v.far is not None else ""
        tip = f"version {v.version[:12]} ({origin}, {v.created_at:%Y-%m-%d %H:%M}): threshold {v.threshold:.4f}{far}, {how}"
        kind = "threshold inherited" if v.threshold_inherited else "threshold"
        chart.mark(v.threshold, tip, f'<circle class="{kind}" cx="{x:.1f}" cy="{y:.1f}" r="4"/>')
    chart.x_labels(["init" if v.round_id is None else f"r{v.round_id}" for v in ordered], "model version (made by round)")
    chart.legend('<circle class="threshold" cx="6" cy="12" r="4"/>', "calibrated for the version")
    chart.legend('<circle class="threshold inherited" cx="6" cy="12" r="4"/>', "inherited from its parent")
    return chart.render()


def charts_html(rounds: Sequence[RoundRow], versions: Sequence[VersionRow]) -> str:
    """The charts section of the operator page: the round charts (or a note before the first round) and
    the threshold chart."""
    boxes = []
    if rounds:
        boxes += [
            ("Uploads against target", uploads_svg(rounds)),
            ("Duration and deadline", duration_svg(rounds)),
            ("What each round changed", change_svg(rounds)),
        ]
    boxes.append(("Verification threshold per version", threshold_svg(versions)))
    note = "" if rounds else NO_ROUND
    return note + '<div class="charts">' + "".join(
        f'<section class="chart-box"><h3>{escape(title)}</h3>\n{svg}</section>' for title, svg in boxes
    ) + "</div>"
