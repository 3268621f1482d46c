"""A report in a notebook: ``Report._repr_html_`` (Jupyter) and ``Report.__rich__`` (rich
consoles, IPython with rich's extension).

The HTML is the ``--html`` page made light for inline display: no JavaScript and no
plotting library (the full page inlines plotly, 3 MB), only HTML tables and one SVG
roofline per chip (log-log: ceilings per pipe and the DRAM slope, the program's unfused,
fused and cache-aware points, the top operators as dots), the assumptions and what was not
counted. The SVG is drawn here from the same numbers as the page's plotly figure.
"""

from __future__ import annotations

import html
import math

from ..bounds.roofline import group_seconds

_STYLE = ("font-family:system-ui,sans-serif;font-size:13px;border-collapse:collapse;"
          "margin:6px 0")
_CELL = "border:1px solid #ccc;padding:2px 8px"
_COLORS = {"unfused": "#d62728", "fused": "#1f77b4", "cache-aware": "#2ca02c"}


def _table_html(t) -> str:
    head = "".join(f'<th style="{_CELL};text-align:{"left" if i in t.left else "right"}">'
                   f"{html.escape(c)}</th>" for i, c in enumerate(t.columns))
    body = "".join(
        "<tr>" + "".join(f'<td style="{_CELL};text-align:{"left" if i in t.left else "right"}">'
                         f"{html.escape(str(x))}</td>" for i, x in enumerate(r)) + "</tr>"
        for r in t.rows)
    return (f'<table style="{_STYLE}"><caption style="text-align:left;font-weight:600">'
            f"{html.escape(t.title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def roofline_svg(rep, arch: str, width: int = 420, height: int = 260) -> str:
    """One chip's roofline as inline SVG (log-log; intensity in FLOP/B, rate in FLOP/s)."""
    spec = next(s for s in rep.specs if s.id == arch)
    bounds = [b for b in rep.bounds if b.arch == arch]
    pts = [(b.mode, b.intensity, b.flops / b.seconds) for b in bounds
           if b.seconds > 0 and b.flops > 0 and math.isfinite(b.intensity) and b.intensity > 0]
    pc = rep.counts
    times = group_seconds(pc, spec, rep.policy)
    order = sorted(range(len(pc.groups)), key=lambda i: -times[i][0])[:12]
    ops = []
    for i in order:
        g, t = pc.groups[i], times[i][0]
        f = sum(g.flops.values())
        if f > 0 and g.traffic.bytes > 0 and t > 0:
            ops.append((f"{g.op} ({g.opname})", f / g.traffic.bytes, f / t))
    peaks = {p: v for p, v in spec.peaks.items() if v and p != "sfu"}
    top = max(peaks.values()) if peaks else 1.0
    xs = [p[1] for p in pts + ops] + [top / spec.bandwidth]
    x0 = 10 ** math.floor(math.log10(max(min(xs), 1e-3)) - 1)
    x1 = 10 ** math.ceil(math.log10(max(xs)) + 1)
    y1 = 10 ** math.ceil(math.log10(top) + 0.3)
    y0 = 10 ** math.floor(math.log10(min([spec.bandwidth * x0] + [p[2] for p in pts + ops])))
    ml, mb, mt, mr = 56, 34, 10, 10

    def X(v):
        return ml + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) \
            * (width - ml - mr)

    def Y(v):
        return height - mb - (math.log10(v) - math.log10(y0)) \
            / (math.log10(y1) - math.log10(y0)) * (height - mb - mt)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'style="font-family:system-ui,sans-serif;font-size:10px;background:#fff">',
           f'<rect x="{ml}" y="{mt}" width="{width - ml - mr}" height="{height - mb - mt}" '
           f'fill="none" stroke="#888"/>']
    for d in range(int(math.log10(x0)), int(math.log10(x1)) + 1):
        out.append(f'<text x="{X(10 ** d):.1f}" y="{height - mb + 12}" text-anchor="middle">'
                   f"1e{d}</text>")
    for d in range(int(math.log10(y0)), int(math.log10(y1)) + 1, 2):
        out.append(f'<text x="{ml - 4}" y="{Y(10 ** d) + 3:.1f}" text-anchor="end">1e{d}</text>')
    out.append(f'<text x="{(width + ml) / 2}" y="{height - 4}" text-anchor="middle">'
               f"FLOP per DRAM byte</text>")
    out.append(f'<text x="12" y="{(height - mb) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 12 {(height - mb) / 2})">FLOP/s</text>')
    # the ceilings of the pipes the program uses (the fused bound's), equal ones as one
    used = next((b.peaks for b in bounds if b.mode == "fused"), None) or {}
    shown = {p: v for p, v in peaks.items() if p in used} or dict(
        sorted(peaks.items(), key=lambda kv: -kv[1])[:1])
    by_value: dict[float, list[str]] = {}
    for p, v in shown.items():
        by_value.setdefault(v, []).append(p)
    for v, names in sorted(by_value.items(), key=lambda kv: -kv[0])[:4]:
        p = ", ".join(sorted(names))
        knee = v / spec.bandwidth
        out.append(f'<polyline fill="none" stroke="#555" stroke-width="1" points="'
                   f'{X(x0):.1f},{Y(spec.bandwidth * x0):.1f} {X(knee):.1f},{Y(v):.1f} '
                   f'{X(x1):.1f},{Y(v):.1f}"><title>{html.escape(p)}: {v:.3g} FLOP/s'
                   f"</title></polyline>")
        out.append(f'<text x="{X(x1) - 3:.1f}" y="{Y(v) - 3:.1f}" text-anchor="end" '
                   f'fill="#555">{html.escape(p)}</text>')
    for name, x, y in ops:
        out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2.5" fill="#999">'
                   f"<title>{html.escape(name)}</title></circle>")
    for mode, x, y in pts:
        out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="5" fill="none" stroke-width="2" '
                   f'stroke="{_COLORS.get(mode, "#000")}"><title>{html.escape(mode)}: '
                   f"{x:.3g} FLOP/B, {y:.3g} FLOP/s</title></circle>")
    ly = mt + 12
    for mode, color in _COLORS.items():
        if any(p[0] == mode for p in pts):
            out.append(f'<circle cx="{ml + 10}" cy="{ly - 3}" r="4" fill="none" '
                       f'stroke="{color}" stroke-width="2"/><text x="{ml + 18}" y="{ly}">'
                       f"{mode}</text>")
            ly += 13
    out.append(f'<text x="{ml + 90}" y="{mt + 12}">{html.escape(spec.id)}</text></svg>')
    return "".join(out)


def notebook_html(rep, top: int = 8) -> str:
    """The report as an HTML fragment for a notebook cell (see the module doc)."""
    from .report import _si
    pc = rep.counts
    parts = [f'<div style="font-family:system-ui,sans-serif;font-size:13px">'
             f"<b>solbound</b> {html.escape(rep.source)}: {len(pc.groups)} operators, "
             f"{_si(pc.macs)} MACs, {_si(sum(pc.flops.values()))} FLOPs, DRAM bytes unfused "
             f"{_si(pc.unfused.bytes)}B, fused {_si(pc.fused.bytes)}B"]
    v = rep.validation
    if v.get("status") != "not requested":
        parts.append(f"<br>validation: <b>{html.escape(str(v.get('status')))}</b> "
                     f"{html.escape(v.get('summary') or v.get('reason') or '')}")
    for t in rep.tables(top):
        parts.append(_table_html(t))
    svgs = [roofline_svg(rep, s.id) for s in rep.specs[:4]
            if any(b.arch == s.id for b in rep.bounds)]
    if svgs:
        parts.append('<div style="display:flex;flex-wrap:wrap;gap:8px">' + "".join(svgs)
                     + "</div>")
    if rep.unsupported:
        parts.append(f'<p style="color:#b00">{len(rep.unsupported)} unsupported operator(s); '
                     f"their work is NOT counted: " + ", ".join(
                         html.escape(f"{u.operator} ({u.source or '?'})")
                         for u in rep.unsupported) + "</p>")
    notes = list(dict.fromkeys(list(rep.program.notes)
                               + [n for b in rep.bounds for n in b.notes]))
    if notes:
        parts.append("<details><summary>notes and assumptions "
                     f"({len(notes)})</summary><ul>" + "".join(
                         f"<li>{html.escape(n)}</li>" for n in notes) + "</ul></details>")
    parts.append("</div>")
    return "".join(parts)


def rich_renderable(rep, top: int = 8):
    """The report for a rich console: its summary lines and tables."""
    from rich.console import Group
    from rich.text import Text

    from .tables import rich_table
    items = [Text.from_markup(line) for line in rep.header_lines()]
    items += [rich_table(t) for t in rep.tables(top)]
    if rep.unsupported:
        items.append(Text(f"{len(rep.unsupported)} unsupported operator(s); their work is NOT "
                          f"counted", style="red"))
    v = rep.validation
    if v.get("status") != "not requested":
        items.append(Text(f"validation: {v.get('status')} "
                          f"{v.get('summary') or v.get('reason') or ''}"))
    return Group(*items)
