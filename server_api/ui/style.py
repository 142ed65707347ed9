"""The `/ui` stylesheet, served as /ui/style.css (a file of its own keeps the pages' CSP strict)."""

CSS = """
:root { color-scheme: light; --ink: #1d2733; --muted: #5b6775; --line: #d8dee6; --accent: #1f6feb; --bad: #c62828; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: var(--ink); }
header { display: flex; align-items: center; gap: 24px; padding: 12px 24px; background: #0d1b2a; color: #fff; }
header h1 { font-size: 18px; margin: 0; }
header .facts { display: flex; gap: 18px; color: #c9d4e0; flex: 1; }
header form { margin: 0; }
main { padding: 8px 24px 32px; max-width: 1280px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", monospace; }
tr.active td { background: #eef5ff; }
.status { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; background: #e8ecf1; }
.status.completed { background: #dff3e4; color: #1b5e20; }
.status.failed { background: #fde2e1; color: var(--bad); }
.status.open, .status.unmasking, .status.aggregating { background: #dbe9ff; color: #0b4fb3; }
.reason { color: var(--bad); }
.muted, .empty { color: var(--muted); }
.chart text.axis { font-size: 11px; fill: var(--muted); }
.chart line.grid { stroke: var(--line); }
.chart rect.selected { fill: #c7d7ee; }
.chart rect.uploaded { fill: var(--accent); }
.chart rect.failed { fill: var(--bad); }
.chart polyline.duration, .chart line.duration { fill: none; stroke: #f29d38; stroke-width: 2; }
.chart circle.duration { fill: #f29d38; }
.chart circle.duration.active { fill: #fff; stroke: #f29d38; stroke-width: 2; }
.chart line.target { stroke: var(--ink); stroke-width: 2; }
.chart line.minimum { stroke: var(--ink); stroke-width: 1.5; stroke-dasharray: 3 2; }
.chart line.deadline { stroke: var(--muted); stroke-width: 1.5; stroke-dasharray: 4 3; }
.chart rect.change { fill: #7b61c9; }
.chart polyline.threshold { fill: none; stroke: var(--accent); stroke-width: 1.5; }
.chart circle.threshold { fill: var(--accent); }
.chart circle.threshold.inherited { fill: #fff; stroke: var(--accent); stroke-width: 2; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr)); gap: 8px 24px; }
.chart-box h3 { font-size: 13px; margin: 8px 0 2px; color: var(--muted); font-weight: 600; }
svg.chart { max-width: 100%; height: auto; }
.login { max-width: 420px; margin: 80px auto; padding: 24px; border: 1px solid var(--line); border-radius: 8px; }
.login input { width: 100%; padding: 8px; margin: 8px 0 12px; font: inherit; }
button { font: inherit; padding: 6px 14px; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
.error { color: var(--bad); }
"""
