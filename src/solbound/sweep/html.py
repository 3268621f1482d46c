"""``--html``: a sweep on one self-contained page (plotly's JavaScript inlined): the bound
against each grid parameter per chip and fidelity, and every point on each chip's
roofline."""

from __future__ import annotations

import html

from .spec import Sweep


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def parameter_figure(sweep: Sweep, rows: list[dict], name: str):
    """The bound (seconds, log) against one parameter: one trace per chip and fidelity,
    points only (the other parameters vary among the points at one value; hover shows
    them); lines join the points only when this is the grid's one parameter."""
    import plotly.graph_objects as go
    fig = go.Figure()
    numeric = all(isinstance(v, (int, float)) for v in sweep.grid[name])
    for arch in dict.fromkeys(r["arch"] for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            pts = [r for r in rows if r["arch"] == arch and r["mode"] == mode
                   and _num(r.get("seconds"))]
            if not pts:
                continue
            pts.sort(key=lambda r: (_num(r[name]) if numeric else str(r[name])))
            fig.add_trace(go.Scatter(
                x=[_num(r[name]) if numeric else str(r[name]) for r in pts],
                y=[_num(r["seconds"]) for r in pts],
                mode="markers+lines" if len(sweep.names) == 1 else "markers",
                name=f"{arch} {mode}",
                text=[", ".join(f"{k}={r[k]}" for k in sweep.names) for r in pts]))
    logx = numeric and all(_num(v) and _num(v) > 0 for v in sweep.grid[name]) and \
        max(map(_num, sweep.grid[name])) / min(map(_num, sweep.grid[name])) >= 8
    fig.update_layout(title=f"Speed of light against {name}", yaxis_type="log",
                      xaxis_type="log" if logx else None, xaxis_title=name,
                      yaxis_title="bound (s)", height=420)
    return fig


def roofline_figure(sweep: Sweep, rows: list[dict], arch: str):
    """Every point of the sweep on one chip's roofline: (FLOP/byte, FLOP/s at the bound)."""
    import plotly.graph_objects as go
    from ..hardware.catalog import load_spec
    fig = go.Figure()
    try:
        spec = load_spec(arch)
    except Exception:  # noqa: BLE001 - a chip from a spec file: points without lines
        spec = None
    pts = [r for r in rows if r["arch"] == arch and _num(r.get("flops"))
           and _num(r.get("bytes")) and _num(r.get("seconds"))]
    if spec is not None:
        lo, hi = 1e-2, 1e4
        for pipe, peak in sorted(spec.peaks.items(), key=lambda kv: -kv[1]):
            knee = peak / spec.bandwidth
            xs = [lo, knee, hi]
            fig.add_trace(go.Scatter(x=xs, y=[min(peak, spec.bandwidth * x) for x in xs],
                                     mode="lines", name=f"{pipe} {peak / 1e12:.3g} T/s",
                                     line={"width": 1}))
    for mode in dict.fromkeys(r["mode"] for r in pts):
        sel = [r for r in pts if r["mode"] == mode]
        fig.add_trace(go.Scatter(
            x=[_num(r["flops"]) / _num(r["bytes"]) for r in sel],
            y=[_num(r["flops"]) / _num(r["seconds"]) for r in sel], mode="markers",
            name=f"points, {mode}",
            text=[", ".join(f"{k}={r[k]}" for k in sweep.names) for r in sel]))
    fig.update_layout(title=f"Every point on the roofline of {arch}", xaxis_type="log",
                      yaxis_type="log", xaxis_title="arithmetic intensity (FLOP/byte)",
                      yaxis_title="rate at the bound (FLOP/s)", height=480)
    return fig


def sweep_html(sweep: Sweep, rows: list[dict]) -> str:
    import plotly.io as pio
    failed = [r for r in rows if r.get("status") not in ("ok", "partial")]
    parts = [f"<h1>solbound sweep: {html.escape(sweep.path)}</h1>",
             f"<p>{html.escape(sweep.program)}; parameters "
             + ", ".join(f"{html.escape(k)} = {html.escape(str(v))}" for k, v in sweep.grid.items())
             + f"; {len(rows)} rows, {len(failed)} failed.</p>"]
    figs = [parameter_figure(sweep, rows, n) for n in sweep.names]
    figs += [roofline_figure(sweep, rows, a) for a in dict.fromkeys(r["arch"] for r in rows)]
    for i, f in enumerate(figs):
        parts.append(pio.to_html(f, full_html=False, include_plotlyjs="inline" if i == 0 else False,
                                 div_id=f"plot{i}"))
    if failed:
        seen = {}
        for r in failed:
            seen.setdefault(tuple(str(r.get(k)) for k in sweep.names), r)
        items = "".join(f"<li>{html.escape(', '.join(f'{k}={r.get(k)}' for k in sweep.names))}: "
                        f"{html.escape(str(r.get('status')))}: {html.escape(str(r.get('error')))}</li>"
                        for r in seen.values())
        parts.append(f"<h2>Failed points</h2><ul>{items}</ul>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>solbound sweep</title>"
            "</head><body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
            + "".join(parts) + "</body></html>")
