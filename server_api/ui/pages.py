"""HTML of the `/ui` pages. Every value from the database passes through `escape`; the pages
load nothing but /ui/style.css and run no script (the charts are inline SVG, `plot`)."""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any

from facecore.federation.status import RoundStatus
from server_api.ui.plot import charts_html
from server_api.ui.view import OperatorView, RoundRow, VersionRow


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{escape(title)}</title><link rel="stylesheet" href="/ui/style.css"></head>\n'
        f"<body>\n{body}\n</body></html>\n"
    )


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "—"


def _duration(seconds: float) -> str:
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _short(version: str | None) -> str:
    return f'<code title="{escape(version)}">{escape(version[:12])}</code>' if version else "—"


def _figure(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else escape(str(value))


def _round_row(r: RoundRow) -> str:
    kind = f"{r.strategy}, {r.aggregation}" + (", secure" if r.secure else "")
    notes = f'<span class="reason">{escape(r.failure_reason)}</span>' if r.failure_reason else ""
    if r.metrics:
        notes += " ".join(f"{escape(k)} {_figure(v)}" for k, v in sorted(r.metrics.items()))
    return (
        f'<tr class="{"active" if r.active else ""}"><td class="num">{r.id}</td>'
        f'<td><span class="status {escape(r.status)}">{escape(r.status)}</span></td><td>{escape(kind)}</td>'
        f'<td class="num">{r.n_checked_in}</td><td class="num">{r.n_selected}</td><td class="num">{r.n_uploaded}</td>'
        f'<td class="num">{r.target} / {r.minimum}</td><td>{_when(r.created_at)}</td><td>{_when(r.closed_at)}</td>'
        f'<td class="num">{_duration(r.duration_s)}{" so far" if r.active else ""}</td>'
        f"<td>{_short(r.base_version)} → {_short(r.result_version)}</td><td>{notes}</td></tr>"
    )


def _version_row(v: VersionRow, current: bool) -> str:
    threshold = f"{v.threshold:.4f}" if v.threshold is not None else '<span class="muted">none published</span>'
    far = f"{v.far:g}" if v.far is not None else "—"
    figures = "; ".join(f"{escape(k)} {_figure(x)}" for k, x in v.figures.items()) or '<span class="muted">—</span>'
    origin = f"round {v.round_id}" if v.round_id is not None else "initial model"
    return (
        f'<tr class="{"active" if current else ""}"><td>{_short(v.version)}{" (current)" if current else ""}</td>'
        f'<td>{escape(v.backbone)}</td><td class="num">{v.embedding_dim}</td><td>{origin}</td>'
        f'<td>{_when(v.created_at)}</td><td class="num">{threshold}</td><td class="num">{far}</td>'
        f"<td>{escape(v.calibration or '—')}</td><td>{figures}</td></tr>"
    )


def operator_page(view: OperatorView) -> str:
    failed = sum(r.status == RoundStatus.FAILED for r in view.rounds)
    active = next((r for r in view.rounds if r.active), None)
    devices = view.devices
    facts = [
        f"{sum(v for k, v in devices.items() if k != 'enrolled')} devices, {devices.get('enrolled', 0)} enrolled",
        f"{len(view.rounds)} rounds shown, {failed} failed",
        f"round {active.id} {active.status}" if active else "no round open",
        f"as of {_when(view.now)} UTC",
    ]
    rounds = (
        "\n".join(_round_row(r) for r in view.rounds) or '<tr><td colspan="12" class="empty">No round yet.</td></tr>'
    )
    current = view.versions[0].version if view.versions else None
    versions = "\n".join(_version_row(v, v.version == current) for v in view.versions)
    spans = "".join(f"<span>{escape(f)}</span>" for f in facts)
    body = f"""<header><h1>FedFace round server</h1><div class="facts">{spans}</div>
<form method="post" action="/ui/logout"><button type="submit">Log out</button></form></header>
<main>
<h2>Rounds at a glance</h2>
{charts_html(view.rounds, view.versions)}
<h2>Rounds</h2>
<table id="rounds"><thead><tr><th class="num">#</th><th>state</th><th>strategy</th><th class="num">checked in</th>
<th class="num">selected</th><th class="num">uploaded</th><th class="num">target / min</th><th>opened</th><th>ended</th>
<th class="num">duration</th><th>model</th><th>failure / training figures</th></tr></thead>
<tbody>{rounds}</tbody></table>
<h2>Model versions</h2>
<table id="versions"><thead><tr><th>version</th><th>backbone</th><th class="num">dim</th><th>from</th><th>created</th>
<th class="num">verify threshold</th><th class="num">FAR</th><th>calibration</th><th>figures</th></tr></thead>
<tbody>{versions}</tbody></table>
<p class="muted">Read-only. Operate the server with <code>fedface admin</code>;
the same data as JSON: <code>/v1/admin/rounds</code>.</p>
</main>"""
    return _page("FedFace operator", body)


def login_page(error: str | None = None) -> str:
    message = f'<p class="error">{escape(error)}</p>' if error else ""
    body = f"""<main><form class="login" method="post" action="/ui/login">
<h1>FedFace operator</h1>
<p class="muted">The admin token: <code>FEDFACE_ADMIN_TOKEN</code>,
or <code>admin_token</code> in a --dev server's data folder.</p>
{message}<label for="token">Admin token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Log in</button></form></main>"""
    return _page("FedFace operator: log in", body)
