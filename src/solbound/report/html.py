"""``--html report.html``: one self-contained page (plotly's JavaScript inlined, no network
needed to view it). It holds:

* a roofline plot per chip: ceilings per pipe and for DRAM bandwidth, each framework
  operator at its arithmetic intensity and attained rate under the unfused model, the
  program's unfused, fused and cache-aware points, and the measured point when there is one;
* the ski-slope curve of the cache-aware fidelity;
* the projection across the report's chips;
* the per-operator table (sortable, with source lines) and the per-module table;
* the notes and assumptions.
"""

from __future__ import annotations

import html

from ..bounds.roofline import group_seconds
from .report import dumps

_SORT_JS = """
function sortTable(th) {
  const table = th.closest('table'), body = table.tBodies[0];
  const col = Array.from(th.parentNode.children).indexOf(th);
  const asc = th.dataset.asc !== '1'; th.dataset.asc = asc ? '1' : '0';
  const key = td => { const v = td.dataset.v; return v !== undefined ? parseFloat(v) : td.textContent; };
  Array.from(body.rows).sort((a, b) => {
    const x = key(a.cells[col]), y = key(b.cells[col]);
    return (x > y ? 1 : x < y ? -1 : 0) * (asc ? 1 : -1);
  }).forEach(r => body.appendChild(r));
}
"""

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { cursor: pointer; background: #f2f2f2; }
td.l, th.l { text-align: left; }
.note { color: #7a5a00; }
"""


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.4g} ms" if s >= 1e-3 else f"{s * 1e6:.4g} us"


def _table(headers: list[str], rows: list[list], left: set[int] = frozenset()) -> str:
    """An HTML table; numeric cells carry ``data-v`` so that sorting is numeric."""
    out = ["<table><thead><tr>"]
    for i, h in enumerate(headers):
        cls = ' class="l"' if i in left else ""
        out.append(f'<th{cls} onclick="sortTable(this)">{html.escape(h)}</th>')
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>")
        for i, c in enumerate(r):
            if isinstance(c, tuple):                    # (shown text, sort value)
                out.append(f'<td data-v="{c[1]!r}">{html.escape(str(c[0]))}</td>')
            else:
                cls = ' class="l"' if i in left else ""
                out.append(f"<td{cls}>{html.escape(str(c))}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def roofline_figure(report, spec):
    """The roofline of ``report`` on ``spec`` (a plotly Figure)."""
    import plotly.graph_objects as go
    pc = report.counts
    fig = go.Figure()
    ais = [1e-2, 1e4]
    bw = spec.bandwidth
    for pipe, peak in sorted(spec.peaks.items(), key=lambda kv: -kv[1]):
        knee = peak / bw
        xs = [ais[0], knee, ais[1]]
        fig.add_trace(go.Scatter(x=xs, y=[min(peak, bw * x) for x in xs], mode="lines",
                                 name=f"{pipe} {peak / 1e12:.3g} T/s", line={"width": 1}))
    times = group_seconds(pc, spec, report.policy)
    xs, ys, texts = [], [], []
    for g, (t, _, _) in zip(pc.groups, times):
        fl = sum(g.flops.values())
        if fl and g.traffic.bytes and t:
            xs.append(fl / g.traffic.bytes)
            ys.append(fl / t)
            texts.append(f"{g.opname} {g.src}")
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="operators (unfused)",
                             text=texts, marker={"size": 6, "opacity": 0.6}))
    flops = sum(pc.flops.values())
    for b in report.bounds:
        if b.arch != spec.id or not b.bytes or not b.seconds:
            continue
        fig.add_trace(go.Scatter(x=[flops / b.bytes], y=[flops / b.seconds], mode="markers",
                                 name=f"program, {b.mode}", marker={"size": 12, "symbol": "diamond"}))
    if report.measured and report.measured.get("arch") == spec.id:
        fused = report.bound(spec.id, "fused")
        for mode, st in report.measured.items():
            if isinstance(st, dict) and "median" in st:
                fig.add_trace(go.Scatter(x=[flops / fused.bytes], y=[flops / st["median"]],
                                         mode="markers", name=f"measured {mode}",
                                         marker={"size": 12, "symbol": "x"}))
    fig.update_layout(title=f"Roofline on {spec.id}", xaxis_type="log", yaxis_type="log",
                      xaxis_title="arithmetic intensity (FLOP/byte)",
                      yaxis_title="attainable rate (FLOP/s)", height=480)
    return fig


def slope_figure(report):
    import plotly.graph_objects as go
    pc = report.program_cache()
    caps = pc.capacities()
    fig = go.Figure(go.Scatter(x=caps, y=[pc.traffic(c).bytes for c in caps],
                               mode="lines+markers", name="cache-aware traffic"))
    fig.add_hline(y=report.counts.fused.bytes, line_dash="dot", annotation_text="fused")
    fig.update_layout(title="DRAM traffic against on-chip capacity", xaxis_type="log",
                      yaxis_type="log", xaxis_title="on-chip capacity (bytes)",
                      yaxis_title="DRAM bytes", height=380)
    return fig


def render_html(report) -> str:
    """The whole page."""
    import plotly.io as pio

    from ..bounds.provision import projection
    pc = report.counts
    parts = [f"<h1>solbound: {html.escape(report.source)}</h1>",
             f"<p>{pc.macs:,} MACs, {sum(pc.flops.values()):,} FLOPs "
             f"({', '.join(f'{k} {v:,}' for k, v in pc.flops.items())}); DRAM bytes unfused "
             f"{pc.unfused.bytes:,}, fused {pc.fused.bytes:,}. Precision policy: "
             f"{html.escape(report.policy.describe())}.</p>"]
    rows = [[b.arch, b.mode, (_fmt_s(b.seconds), b.seconds), (_fmt_s(b.compute_seconds),
             b.compute_seconds), (_fmt_s(b.memory_seconds), b.memory_seconds),
             (f"{b.bytes:,}", b.bytes), b.bound] for b in report.bounds]
    parts.append("<h2>Bounds</h2>" + _table(["arch", "mode", "time", "compute", "memory",
                                             "bytes", "bound"], rows, {0, 1, 6}))
    if report.measured:
        hr = report.headroom()
        rows = [[m, (_fmt_s(report.measured[m]["median"]), report.measured[m]["median"]),
                 *[(f"{hr[m].get(f, 0):.3g}x", hr[m].get(f, 0)) for f in ("unfused", "fused",
                                                                          "cache-aware")]]
                for m in hr]
        parts.append(f"<h2>Measured on {html.escape(str(report.measured.get('arch')))}</h2>"
                     + _table(["mode", "median", "headroom unfused", "headroom fused",
                               "headroom cache-aware"], rows, {0}))
    figs = [roofline_figure(report, s) for s in report.specs]
    if report.graph is not None and report.counts.kernels:
        figs.append(slope_figure(report))
    for i, f in enumerate(figs):
        parts.append(pio.to_html(f, full_html=False, include_plotlyjs="inline" if i == 0 else False,
                                 div_id=f"plot{i}"))
    proj = projection(report)
    rows = [[r["arch"], *[(_fmt_s(r["seconds"].get(m, 0)), r["seconds"].get(m, 0))
                          for m in ("unfused", "fused", "cache-aware")],
             (f"{r.get('fusion_benefit', 0):.3g}x", r.get("fusion_benefit", 0)),
             (f"{r.get('cache_penalty', 0):.3g}x", r.get("cache_penalty", 0)),
             r.get("binding", "-")] for r in proj]
    parts.append("<h2>Across chips</h2>" + _table(["arch", "unfused", "fused", "cache-aware",
                                                   "fusion benefit", "cache penalty", "binds"],
                                                  rows, {0, 6}))
    spec = report.specs[0] if report.specs else None
    if spec is not None:
        times = group_seconds(pc, spec, report.policy)
        rows = [[g.opname, report.module_of(g.op) or "-", g.src or "-",
                 (_fmt_s(t), t), (f"{sum(g.flops.values()):,}", sum(g.flops.values())),
                 (f"{g.traffic.bytes:,}", g.traffic.bytes)]
                for g, (t, _, _) in zip(pc.groups, times)]
        parts.append(f"<h2>Operators (unfused time on {spec.id}; click a header to sort)</h2>"
                     + _table(["operator", "module", "source", "time", "FLOPs", "bytes"],
                              rows, {0, 1, 2}))
        mods = report.by_module(None, spec.id)
        rows = [[m["module"] or "(top)", (_fmt_s(m["seconds"]), m["seconds"]),
                 (f"{m['flops']:,}", m["flops"]), (f"{m['bytes_unfused']:,}", m["bytes_unfused"])]
                for m in mods]
        parts.append("<h2>Modules</h2>" + _table(["module", "time", "FLOPs", "bytes"], rows, {0}))
    notes = list(dict.fromkeys(list(report.program.notes) + [n for b in report.bounds
                                                               for n in b.notes]))
    if notes or report.unsupported:
        items = [f'<li class="note">{html.escape(n)}</li>' for n in notes]
        items += [f"<li>unsupported: {html.escape(u.operator)} at {html.escape(u.source or '?')}"
                  f": {html.escape(u.reason)}</li>" for u in report.unsupported]
        parts.append("<h2>Notes and assumptions</h2><ul>" + "".join(items) + "</ul>")
    data = dumps({"source": report.source, "macs": pc.macs})
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>solbound: "
            f"{html.escape(report.source)}</title><style>{_CSS}</style>"
            f"<script>{_SORT_JS}</script></head><body data-report='{html.escape(data)}'>"
            + "\n".join(parts) + "</body></html>")


__all__ = ["render_html", "roofline_figure", "slope_figure"]
