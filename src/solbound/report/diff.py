"""``solbound diff old.json new.json``: what moved between two reports of one program.

Pure functions over two report dicts (the JSON ``analyze --json`` writes, schema
``solbound.report/*``):

* the bounds, per chip and fidelity: time before and after, and why it moved (the binding
  resource changed; the work, the DRAM bytes of that fidelity, or the chip's peaks moved:
  fused bytes up with the same work is a fusion lost);
* the operators, matched by module, operator name and order of appearance within them (not
  by line: an edit above them moves every line): MACs, FLOPs and unfused bytes, with a
  reason (a new operator, one removed, a dtype changed, more or less work, more or fewer
  bytes);
* the modules, rolled up as ``--by-module`` does.

:func:`regressions` names the bounds that slowed by more than a percentage, for a CI gate.

>>> a = {"source": "m.py", "bounds": [{"arch": "h100-sxm", "mode": "fused", "seconds": 1.0,
...       "bound": "memory", "bytes": 100, "flops": 10, "peaks": {}}],
...      "operators": [{"op": "mm", "name": "aten.mm", "module": "fc", "macs": 5, "flops": 10,
...                     "bytes_unfused": 100}], "modules": [], "kernels": []}
>>> b = {**a, "bounds": [{**a["bounds"][0], "seconds": 1.25, "bytes": 120}]}
>>> d = diff(a, b)
>>> d["bounds"][0]["change"], d["bounds"][0]["why"]
(0.25, ['fused bytes 100 -> 120 with the same FLOPs (an intermediate now goes to DRAM: a fusion lost)'])
>>> [r["arch"] for r in regressions(d, 10.0)]
['h100-sxm']
"""

from __future__ import annotations

from collections import defaultdict

SCHEMA = "solbound.diff/1"


class DiffError(ValueError):
    """Two reports that cannot be compared (the message says why, in one line)."""


def _check(old: dict, new: dict, any_program: bool) -> None:
    for name, r in (("old", old), ("new", new)):
        if not isinstance(r, dict) or "bounds" not in r or "operators" not in r:
            raise DiffError(f"the {name} file is not a solbound report (write one with "
                            f"`solbound analyze PROGRAM --json FILE`)")
    if not any_program and old.get("source") != new.get("source"):
        raise DiffError(f"the reports are of different programs ({old.get('source')!r} and "
                        f"{new.get('source')!r}); pass --any-program to compare them anyway")


def _rel(a: float, b: float) -> float | None:
    return None if not a else (b - a) / a


def _bound_why(a: dict, b: dict) -> list[str]:
    why = []
    mode = b.get("mode", "")
    if a.get("bound") != b.get("bound"):
        why.append(f"bound by {a.get('bound')} -> {b.get('bound')}")
    if a.get("flops") != b.get("flops"):
        why.append(f"FLOPs {a.get('flops'):,} -> {b.get('flops'):,} (the work changed)")
    if a.get("bytes") != b.get("bytes"):
        if a.get("flops") == b.get("flops") and mode == "fused" \
                and (b.get("bytes") or 0) > (a.get("bytes") or 0):
            why.append(f"fused bytes {a['bytes']:,} -> {b['bytes']:,} with the same FLOPs (an "
                       f"intermediate now goes to DRAM: a fusion lost)")
        else:
            why.append(f"{mode} bytes {a.get('bytes'):,} -> {b.get('bytes'):,}")
    pa, pb = a.get("peaks") or {}, b.get("peaks") or {}
    gone, came = sorted(set(pa) - set(pb)), sorted(set(pb) - set(pa))
    if gone or came:
        why.append(f"work on other pipes ({', '.join(came) or 'none'} instead of "
                   f"{', '.join(gone) or 'none'}: a dtype or the precision policy changed)")
    moved = sorted(k for k in set(pa) & set(pb) if pa[k] != pb[k])
    if moved:
        why.append(f"the chip's peaks changed ({', '.join(moved)}: a clock or a chip file)")
    return why


def _op_dtypes(report: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for k in report.get("kernels", []):
        if k.get("dtype"):
            out[k.get("op", "")].add(k["dtype"])
    return out


def _keyed(ops: list[dict]) -> dict[tuple, dict]:
    """Operators by (module, name, n-th of that pair)."""
    seen: dict[tuple, int] = defaultdict(int)
    out = {}
    for o in ops:
        pair = (o.get("module", ""), o.get("name", ""))
        out[pair + (seen[pair],)] = o
        seen[pair] += 1
    return out


def diff(old: dict, new: dict, any_program: bool = False) -> dict:
    """What moved from ``old`` to ``new`` (see the module doc)."""
    _check(old, new, any_program)
    ob = {(b["arch"], b["mode"]): b for b in old["bounds"]}
    bounds = []
    for b in new["bounds"]:
        a = ob.get((b["arch"], b["mode"]))
        if a is None:
            bounds.append({"arch": b["arch"], "mode": b["mode"], "old": None,
                           "new": b["seconds"], "change": None, "why": ["a chip or fidelity "
                                                                          "the old report lacks"]})
            continue
        bounds.append({"arch": b["arch"], "mode": b["mode"], "old": a["seconds"],
                       "new": b["seconds"], "change": _rel(a["seconds"], b["seconds"]),
                       "why": _bound_why(a, b)})
    oa, na = _keyed(old["operators"]), _keyed(new["operators"])
    da, dn = _op_dtypes(old), _op_dtypes(new)
    ops = []
    for key in list(oa) + [k for k in na if k not in oa]:
        a, b = oa.get(key), na.get(key)
        row = {"module": key[0], "name": key[1], "index": key[2],
               "op": (b or a)["op"], "source": (b or a).get("source", "")}
        if a is None:
            ops.append({**row, "why": ["a new operator"], **_vals(None, b)})
            continue
        if b is None:
            ops.append({**row, "why": ["an operator removed"], **_vals(a, None)})
            continue
        why = []
        ta, tb = da.get(a["op"], set()), dn.get(b["op"], set())
        if ta != tb and ta and tb:
            why.append(f"dtype {','.join(sorted(ta))} -> {','.join(sorted(tb))}")
        for field, what in (("macs", "MACs"), ("flops", "FLOPs"), ("bytes_unfused", "bytes")):
            if a.get(field) != b.get(field):
                why.append(f"{what} {a.get(field):,} -> {b.get(field):,}")
        if why:
            ops.append({**row, "why": why, **_vals(a, b)})
    ma = {m["module"]: m for m in old.get("modules", [])}
    mb = {m["module"]: m for m in new.get("modules", [])}
    modules = []
    for name in list(ma) + [m for m in mb if m not in ma]:
        a, b = ma.get(name), mb.get(name)
        fields = ("seconds", "macs", "flops", "bytes_unfused")
        if a and b and all(a.get(f) == b.get(f) for f in fields):
            continue
        modules.append({"module": name, **{f: [a.get(f) if a else None, b.get(f) if b else None]
                                           for f in fields}})
    return {"schema": SCHEMA, "old": old.get("source"), "new": new.get("source"),
            "bounds": bounds, "operators": ops, "modules": modules,
            "totals": {k: [old.get("totals", {}).get(k), new.get("totals", {}).get(k)]
                       for k in ("macs", "flops", "bytes")}}


def _vals(a: dict | None, b: dict | None) -> dict:
    return {f: [a.get(f) if a else None, b.get(f) if b else None]
            for f in ("macs", "flops", "bytes_unfused")}


def regressions(d: dict, percent: float, mode: str | None = None) -> list[dict]:
    """The bounds (of ``mode``, or every fidelity) that slowed by more than ``percent``."""
    return [b for b in d["bounds"] if (mode is None or b["mode"] == mode)
            and b["change"] is not None and b["change"] * 100 > percent]


def tables(d: dict, top: int = 20) -> list:
    """The diff as report tables (``report/tables.py``)."""
    from .report import _si, _t
    from .tables import Table

    def pct(c):
        return "-" if c is None else f"{c * 100:+.1f}%"
    out = [Table("Bounds", ["arch", "mode", "old", "new", "change", "why"],
                 [[b["arch"], b["mode"], _t(b["old"]) if b["old"] is not None else "-",
                   _t(b["new"]), pct(b["change"]), "; ".join(b["why"]) or "-"]
                  for b in d["bounds"]], left={0, 1, 5},
                 raw_columns=["arch", "mode", "old (s)", "new (s)", "change", "why"],
                 raw_rows=[[b["arch"], b["mode"], b["old"], b["new"], b["change"],
                            "; ".join(b["why"])] for b in d["bounds"]])]
    ops = d["operators"][:top]
    if ops:
        out.append(Table(
            f"Operators that changed ({len(d['operators'])}" +
            (f", first {top}" if len(d["operators"]) > top else "") + ")",
            ["operator", "module", "source", "MACs", "bytes", "why"],
            [[o["name"], o["module"] or "-", o["source"] or "-",
              " -> ".join("-" if v is None else _si(v) for v in o["macs"]),
              " -> ".join("-" if v is None else _si(v) + "B" for v in o["bytes_unfused"]),
              "; ".join(o["why"])] for o in ops], left={0, 1, 2, 5},
            raw_columns=["operator", "module", "source", "old MACs", "new MACs",
                         "old bytes (B)", "new bytes (B)", "why"],
            raw_rows=[[o["name"], o["module"], o["source"], *o["macs"], *o["bytes_unfused"],
                       "; ".join(o["why"])] for o in ops]))
    if d["modules"]:
        out.append(Table(
            "Modules that changed", ["module", "time", "MACs", "bytes"],
            [[m["module"], " -> ".join("-" if v is None else _t(v) for v in m["seconds"]),
              " -> ".join("-" if v is None else _si(v) for v in m["macs"]),
              " -> ".join("-" if v is None else _si(v) + "B" for v in m["bytes_unfused"])]
             for m in d["modules"]], left={0},
            raw_columns=["module", "old time (s)", "new time (s)", "old MACs", "new MACs",
                         "old bytes (B)", "new bytes (B)"],
            raw_rows=[[m["module"], *m["seconds"], *m["macs"], *m["bytes_unfused"]]
                      for m in d["modules"]]))
    return out
