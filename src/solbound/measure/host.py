"""The machine solbound runs on: where its measured spec lives, what the OS says about its
caches, the statistics of timed trials, and the spec file ``solbound calibrate`` writes (the
catalog's own schema, ``hardware/specs/*.toml``). The measuring itself needs a framework:
``frontends/torch/calibrate.py`` (kernels) and ``frontends/torch/timing.py`` (programs).
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time

from ..paths import CONFIG_ENV, config_dir, host_spec_path  # noqa: F401 - re-exported


class MeasureError(RuntimeError):
    """A program that cannot be timed here (too large for this machine, no device)."""


def wall_clock(call) -> float:
    """Seconds ``call()`` takes on the host's clock."""
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def time_trials(fn, trials: int, warmup: int = 1, flush=None, clock=wall_clock) -> list[float]:
    """Seconds of each of ``trials`` timed calls of ``fn`` after ``warmup`` untimed ones;
    ``flush()``, where given, runs before every call, outside the timing; ``clock(call)``
    times one call (the host's clock; a device's events for work on the device)."""
    out = []
    for i in range(warmup + trials):
        if flush is not None:
            flush()
        t = clock(fn)
        if i >= warmup:
            out.append(t)
    return out


def rates_of(work: float, times: list[float]) -> dict:
    rates = sorted(work / t for t in times)
    return {"value": rates[-1], "min": rates[0], "median": statistics.median(rates),
            "max": rates[-1]}


def caches() -> dict[str, int]:
    """Cache capacities the OS reports for this machine (bytes): per-core levels times the
    cores that have one, shared levels once."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    out: dict[str, int] = {}
    if not os.path.isdir(root):
        return out
    ncpu = os.cpu_count() or 1
    for entry in sorted(os.listdir(root)):
        if not entry.startswith("index"):
            continue
        d = os.path.join(root, entry)
        try:
            level = int(open(os.path.join(d, "level")).read())
            kind = open(os.path.join(d, "type")).read().strip()
            size = open(os.path.join(d, "size")).read().strip()
            shared = open(os.path.join(d, "shared_cpu_list")).read().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        n = int(size[:-1]) * {"K": 1024, "M": 2**20, "G": 2**30}[size[-1]] \
            if size[-1] in "KMG" else int(size)
        sharers = sum((int(b) - int(a) + 1) if "-" in part else 1
                      for part in shared.split(",") for a, _, b in [part.partition("-")])
        copies = max(1, ncpu // max(1, sharers))
        out[f"l{level}"] = out.get(f"l{level}", 0) + n * copies
    return out


def spec_toml(res: dict, framework: str, name: str | None = None, *, kind: str = "cpu",
              vendor: str = "host", fallback=None) -> str:
    """The measurements (``res``: key -> value, min, median, max, unit, how) as a chip spec
    in the catalog's schema; ``framework`` says what measured them.

    A CPU (``kind="cpu"``): cache capacities from the OS (``res["caches"]``), every pipe
    on the vector units. A GPU (``kind="gpu"``): on-chip capacities and SM count as the
    driver reports them (``res["onchip"]``, ``res["compute"]``: level -> (value, how)),
    pipes on their native units; the pipes not measured (FP64, FP8, INT8) are taken from
    ``fallback``, the catalog entry the device matches, and say so."""
    host = platform.node() or "host"
    when = datetime.datetime.now().isoformat(timespec="seconds")
    tag = f"solbound calibrate on {host} at {when} ({framework})"

    def entry(r, unit):
        src = f"{tag}: {r['how']}, best of the trials"
        return (f'{{ value = {r["value"]:.6g}, unit = "{unit}", source = "{src}", '
                f'min = {r["min"]:.6g}, median = {r["median"]:.6g}, max = {r["max"]:.6g} }}')

    def given(value, unit, how):            # counts and bytes exactly
        v = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
        return f'{{ value = {v}, unit = "{unit}", source = "{tag}: {how}" }}'
    default_name = platform.processor() or platform.machine()
    what = ("Every pipe runs on the vector units." if kind == "cpu" else
            "Pipes not measured come from the catalog entry named in their source.")
    lines = ['id = "host"', f'name = "{name or default_name} ({host}, measured)"',
             f'vendor = "{vendor}"', f'kind = "{kind}"', f'notes = "Measured by {tag}. {what}"',
             "", "[dram]", f"bandwidth = {entry(res['bandwidth'], 'B/s')}"]
    if "memory" in res:
        lines.append(f"capacity = {given(res['memory'][0], 'B', res['memory'][1])}")
    lines.append("")
    cs = res.get("caches", {})
    if res.get("onchip"):
        lines.append("[onchip]")
        for key, (value, how) in res["onchip"].items():
            lines.append(f"{key} = {given(value, 'B', how)}")
        lines.append("")
    elif cs:
        lines.append("[onchip]")
        levels = sorted(cs)
        last = levels[-1]
        for lv in levels:
            # the last level is the one before DRAM; L1 is not listed
            key = "llc" if lv == last and lv != "l1" else ("l2" if lv == "l2" else None)
            if key:
                lines.append(f'{key} = {{ value = {cs[lv]}, unit = "B", source = "{tag}: '
                             f'/sys/devices/system/cpu/cpu0/cache ({lv})" }}')
        lines.append("")
    if res.get("compute"):
        lines.append("[compute]")
        for key, (value, how) in res["compute"].items():
            lines.append(f"{key} = {given(value, 'count' if key == 'sm_count' else 'Hz', how)}")
        lines.append("")
    lines.append("[peaks]")
    from ..hardware.catalog import SECTION_KEYS
    for key in sorted(SECTION_KEYS["peaks"]):
        if key in res:
            lines.append(f"{key} = {entry(res[key], res[key]['unit'])}")
        elif fallback is not None and key in fallback.peaks:
            e = fallback.entries.get(key, {})
            unit = e.get("unit", "FLOP/s")
            # the catalog's peak at the clock it was loaded at (default the chip's highest)
            lines.append(f'{key} = {{ value = {fallback.peaks[key]!r}, unit = "{unit}", '
                         f'source = "catalog {fallback.id}, not measured by calibrate", '
                         f'uncertain = true }}')
    if kind == "cpu":
        lines += ["", "[units]"]
        # transcendentals stay a pipe of their own: torch.exp's measured rate includes its
        # loads and stores, below what a fused kernel's in-register exp reaches, so
        # charging it to the vector units could put a bound above a real kernel
        for pipe in ("tensor_bf16",):
            if pipe in res:
                lines.append(f'{pipe} = {{ value = "vector", source = "a CPU runs it on its '
                             f'vector units" }}')
    return "\n".join(lines) + "\n"


def time_calls(call, trials: int, warmup: int, flush=None, clock=wall_clock) -> dict:
    """``call()`` timed the way careful benchmarks do: ``warmup`` calls, then ``trials``
    timed calls, each after a write over a buffer twice the largest cache (the caller's
    inputs and weights come from DRAM; ``flush()``, where given, flushes the device the
    call runs on instead, and ``clock`` times it there); the statistics of the timed ones."""
    if flush is None:
        import numpy as np
        buf = np.empty(flush_bytes() // 8)
        writes = iter(range(1 << 62))

        def flush():
            buf.fill(next(writes))
    return trial_stats(time_trials(call, trials, warmup, flush, clock))


def flush_bytes() -> int:
    """What ``time_calls`` writes before each trial: twice the largest cache."""
    return max(caches().values() or [32 << 20]) * 2


def trial_stats(times: list[float]) -> dict:
    """Median and spread of timed trials (seconds)."""
    s = sorted(times)
    return {"median": statistics.median(s), "min": s[0], "max": s[-1],
            "stdev": statistics.stdev(s) if len(s) > 1 else 0.0, "trials": len(s)}


__all__ = ["config_dir", "host_spec_path", "caches", "spec_toml", "trial_stats", "time_calls",
           "flush_bytes",
           "time_trials", "wall_clock", "rates_of"]
