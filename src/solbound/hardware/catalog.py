"""The hardware catalog: one TOML file per chip in ``specs/``, every number with its source.

>>> spec = load_spec("h100-sxm")
>>> spec.bandwidth
3350000000000.0

Every rate states the clock it assumes: an entry's own ``clock``, else the chip's
``[compute] clock`` (its highest boost clock). A spec's peaks are scaled to one clock
(``at_clock``): by default the highest clock the chip runs at, which gives the bound no kernel
can beat; ``datasheet`` keeps the vendor's rates as printed; a number is a sustained clock.
The H100 SXM's 989.4 dense bf16 TFLOPS are stated at 1830 MHz; its SMs boost to 1980 MHz:

>>> round(spec.peak("tensor_bf16") / 1e12, 1), spec.clocked
(1070.5, 'max')
>>> load_spec("h100-sxm@datasheet").peak("tensor_bf16")
989400000000000.0
>>> round(load_spec("h100-sxm@1755MHz").peak("tensor_bf16") / 1e12, 1)
948.9
"""

from __future__ import annotations

import functools
import os
import tomllib
from dataclasses import dataclass, field
from importlib import resources

SPEC_DIR = "specs"
DEFAULT_ARCHS = ("h100-sxm", "a100-sxm", "b200")


class UnknownArch(KeyError):
    def __str__(self) -> str:
        return self.args[0]


class SpecError(ValueError):
    """A chip file that does not follow the catalog's schema (the message names the field)."""


# the catalog's schema: what a chip file may contain
TOP_KEYS = {"id", "name", "vendor", "kind", "notes", "dram", "onchip", "compute", "peaks", "units",
            "links", "cost"}
SECTION_KEYS = {"dram": {"bandwidth", "capacity"},
                "onchip": {"l2", "llc", "smem", "regs", "vmem", "cmem"},
                "compute": {"sm_count", "clock"},
                "peaks": {"vector_fp64", "vector_fp32", "vector_fp16", "vector_bf16",
                          "tensor_fp64", "tensor_tf32", "tensor_fp16", "tensor_bf16",
                          "tensor_fp8", "tensor_fp4", "tensor_int8", "sfu"},
                # per GPU: bandwidths are bytes/s in one direction; the domain is how many
                # GPUs the scale-up fabric joins; in_network_reduction: the switch reduces
                # (NVLS, SHARP), a boolean
                "links": {"scale_up", "scale_up_domain", "in_network_reduction", "scale_out"},
                # what an hour of the chip costs (USD/h, a cloud list price or your own): the
                # report gives each bound's cost at it
                "cost": {"price_per_hour"}}
BOOLEAN_KEYS = {("links", "in_network_reduction")}
# min/median/max: the spread of a measured value over its trials (``solbound calibrate``)
# clock: the clock (Hz) a rate is stated at, where it is not the chip's [compute] clock
ENTRY_KEYS = {"value", "unit", "source", "uncertain", "note", "min", "median", "max", "clock"}
UNIT_NAMES = {"tensor", "vector", "fp64", "sfu"}


@dataclass(frozen=True)
class Spec:
    id: str
    name: str
    vendor: str
    bandwidth: float                       # DRAM B/s
    peaks: dict[str, float]                # pipe -> ops/s (dense)
    onchip: dict[str, float]               # level -> bytes
    entries: dict[str, dict] = field(repr=False, default_factory=dict)  # key -> {value, source, ...}
    path: str = ""
    units: dict[str, str] = field(default_factory=dict)   # pipe -> physical unit (overrides)
    links: dict[str, float] = field(default_factory=dict)  # [links]: see SECTION_KEYS
    clock: float | None = None             # [compute] clock: the highest boost clock, Hz
    # the clock the peaks are scaled to: "max" (the chip's clock), "datasheet" (each rate
    # at its own stated clock) or a number of Hz (a sustained clock)
    clocked: str | float = "datasheet"

    def peak(self, pipe: str) -> float | None:
        return self.peaks.get(pipe)

    def rate_clock(self, pipe: str) -> float | None:
        """The clock a peak is stated at: its entry's ``clock``, else the chip's clock."""
        c = self.entries.get(pipe, {}).get("clock")
        return float(c) if c else self.clock

    def at_clock(self, clock: str | float = "max") -> "Spec":
        """This chip with every compute peak scaled to ``clock``: ``"max"`` (the chip's
        ``[compute] clock``, the highest it runs at: no kernel beats a bound at it),
        ``"datasheet"`` (each rate as the vendor prints it) or Hz (a sustained clock).
        Memory bandwidth and capacities do not follow the SM clock."""
        import dataclasses
        if clock == "datasheet":
            peaks = {p: float(self.entries[p]["value"]) if p in self.entries else v
                     for p, v in self.peaks.items()}
            return dataclasses.replace(self, peaks=peaks, clocked="datasheet")
        target = self.clock if clock == "max" else float(clock)
        peaks = {}
        for p, v in self.peaks.items():
            raw = float(self.entries[p]["value"]) if p in self.entries else v
            at = self.rate_clock(p)
            if target is None or at is None:
                if clock != "max":
                    raise SpecError(f"{self.id}: {p} states no clock (no [compute] clock and "
                                    f"no clock on the entry), so it cannot be scaled to "
                                    f"{clock_text(target)}")
                peaks[p] = raw
                continue
            peaks[p] = raw if at == target else raw * target / at
        return dataclasses.replace(self, peaks=peaks, clocked=clock)

    def clock_note(self) -> str:
        """What clock the peaks assume, where that is not each rate as printed ("" else)."""
        scaled = sorted(p for p in self.peaks if p in self.entries
                        and self.peaks[p] != float(self.entries[p]["value"]))
        if not scaled:
            return ""
        at = sorted({clock_text(self.rate_clock(p)) for p in scaled})
        how = ("the chip's highest boost clock" if self.clocked == "max"
               else "a sustained clock given")
        target = self.clock if self.clocked == "max" else float(self.clocked)
        return (f"{self.id}: compute peaks at {clock_text(target)} ({how}); the data sheet "
                f"states {', '.join(scaled)} at {', '.join(at)} (@datasheet for those rates)")

    def unit_of(self, pipe: str) -> str:
        """The physical unit a pipe's work runs on: work on one unit adds up in time
        (TF32 and bf16 matmuls share the tensor cores; fp32 and bf16 elementwise work
        shares the vector cores), different units run concurrently.

        Default (NVIDIA): ``tensor_*`` on the tensor cores, ``vector_fp64`` on the
        dedicated FP64 units, ``sfu`` on the special-function units, other ``vector_*``
        on the vector (CUDA) cores. A spec's ``[units]`` table overrides a pipe (on
        AMD CDNA, FP64 and transcendental instructions issue on the vector ALUs).

        >>> load_spec("h100-sxm").unit_of("tensor_tf32"), load_spec("h100-sxm").unit_of("vector_bf16")
        ('tensor', 'vector')
        >>> load_spec("mi300x").unit_of("sfu")
        'vector'
        """
        if pipe in self.units:
            return self.units[pipe]
        if pipe.startswith("tensor_"):
            return "tensor"
        if pipe in ("sfu", "vector_fp64"):
            return {"sfu": "sfu", "vector_fp64": "fp64"}[pipe]
        return "vector"

    def dram_cache(self) -> str:
        """The on-chip level whose capacity bounds DRAM traffic by default: the last level
        before DRAM (AMD's Infinity Cache ``llc``, else ``l2``, else a TPU's ``vmem`` or
        ``cmem``).

        >>> load_spec("h100-sxm").dram_cache(), load_spec("mi300x").dram_cache()
        ('l2', 'llc')
        """
        for level in ("llc", "l2", "cmem", "vmem"):
            if self.onchip.get(level):
                return level
        raise ValueError(f"{self.id} lists no on-chip cache level (onchip.l2, llc, vmem or cmem)")

    def capacity(self, level: str | None = None) -> float:
        """Bytes of on-chip level ``level`` (default: ``dram_cache()``): ``l2``, ``llc``,
        ``smem`` (shared memory per SM times SMs), ``regs`` (register files), ``vmem``..."""
        level = level or self.dram_cache()
        if not self.onchip.get(level):
            have = ", ".join(sorted(self.onchip)) or "none"
            raise ValueError(f"{self.id} has no on-chip level {level!r} (it lists: {have})")
        return self.onchip[level]

    @property
    def price_per_hour(self) -> float | None:
        """USD per hour of this chip, from its ``[cost] price_per_hour`` (None if absent)."""
        v = self.entries.get("cost.price_per_hour", {}).get("value")
        return float(v) if v is not None else None

    def source(self, key: str) -> str:
        return self.entries.get(key, {}).get("source", "")

    def uncertain(self, key: str) -> bool:
        return bool(self.entries.get(key, {}).get("uncertain", False))


def _check(data: dict, path: str) -> None:
    """Every field of a chip file against the catalog's schema (a clear error per field)."""
    for key in data:
        if key not in TOP_KEYS:
            raise SpecError(f"{path}: unknown field {key!r} (allowed: {', '.join(sorted(TOP_KEYS))})")
    for key in ("id", "name"):
        if not isinstance(data.get(key), str) or not data.get(key):
            raise SpecError(f"{path}: field {key!r} is required (a non-empty string)")
    for section, allowed in SECTION_KEYS.items():
        sec = data.get(section, {})
        if not isinstance(sec, dict):
            raise SpecError(f"{path}: [{section}] must be a table")
        for key, val in sec.items():
            where = f"{path}: {section}.{key}"
            if key not in allowed:
                raise SpecError(f"{where}: unknown field (allowed in [{section}]: "
                                f"{', '.join(sorted(allowed))})")
            if not isinstance(val, dict) or "value" not in val or "source" not in val:
                raise SpecError(f"{where} needs a value and a source, e.g. "
                                f"{{ value = 1e12, unit = \"B/s\", source = \"datasheet\" }}")
            extra = set(val) - ENTRY_KEYS
            if extra:
                raise SpecError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
            v = val["value"]
            if (section, key) in BOOLEAN_KEYS:
                if not isinstance(v, bool):
                    raise SpecError(f"{where}: value {v!r} is not true or false")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                    or v == float("inf"):
                raise SpecError(f"{where}: value {v!r} is not a positive number")
            if not isinstance(val["source"], str) or not val["source"].strip():
                raise SpecError(f"{where}: source must say where the number comes from")
    if "bandwidth" not in data.get("dram", {}):
        raise SpecError(f"{path}: dram.bandwidth is required")
    if not data.get("peaks"):
        raise SpecError(f"{path}: [peaks] needs at least one pipe "
                        f"({', '.join(sorted(SECTION_KEYS['peaks']))})")
    for pipe, val in data.get("units", {}).items():
        if pipe not in SECTION_KEYS["peaks"]:
            raise SpecError(f"{path}: units.{pipe}: not a pipe")
        if not (isinstance(val, dict) and val.get("value") in UNIT_NAMES and "source" in val):
            raise SpecError(f"{path}: units.{pipe} needs a unit ({', '.join(sorted(UNIT_NAMES))}) "
                            f"as value and a source")


def _parse(data: dict, path: str) -> Spec:
    _check(data, path)
    entries: dict[str, dict] = {}
    for section in ("dram", "onchip", "compute", "peaks", "links", "cost"):
        for key, val in data.get(section, {}).items():
            entries[key if section == "peaks" else f"{section}.{key}"] = val
    units = {}
    for pipe, val in data.get("units", {}).items():
        if not (isinstance(val, dict) and isinstance(val.get("value"), str) and "source" in val):
            raise ValueError(f"{path}: units.{pipe} needs a unit name (value) and a source")
        units[pipe] = val["value"]
        entries[f"units.{pipe}"] = val
    bw = data.get("dram", {}).get("bandwidth")
    if bw is None:
        raise ValueError(f"{path}: dram.bandwidth is required")
    return Spec(
        id=data["id"], name=data["name"], vendor=data.get("vendor", ""),
        bandwidth=float(bw["value"]),
        peaks={k: float(v["value"]) for k, v in data.get("peaks", {}).items()},
        onchip={k: float(v["value"]) for k, v in data.get("onchip", {}).items()},
        entries=entries, path=path, units=units,
        links={k: v["value"] for k, v in data.get("links", {}).items()},
        clock=float(data["compute"]["clock"]["value"]) if "clock" in data.get("compute", {})
        else None).at_clock("max")


def clock_text(hz: float | None) -> str:
    """A clock in MHz.

    >>> clock_text(1.83e9), clock_text(1755e6)
    ('1830 MHz', '1755 MHz')
    """
    return "no clock" if hz is None else f"{hz / 1e6:.0f} MHz"


def parse_clock(text: str) -> str | float:
    """``max``, ``datasheet``, or a clock: ``1755MHz``, ``1.755GHz``, ``1755`` (MHz).

    >>> parse_clock("max"), parse_clock("1.98GHz"), parse_clock("1755")
    ('max', 1980000000.0, 1755000000.0)
    """
    import re
    t = text.strip().lower()
    if t in ("max", "datasheet"):
        return t
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(ghz|mhz|hz)?", t)
    if not m:
        raise SpecError(f"clock {text!r}: use max, datasheet, or a clock such as 1755MHz or "
                        f"1.755GHz (a bare number is MHz)")
    v = float(m.group(1)) * {"ghz": 1e9, "mhz": 1e6, "hz": 1.0, None: 1e6}[m.group(2)]
    if not v > 0:
        raise SpecError(f"clock {text!r} is not positive")
    return v


def spec_from_file(path: str) -> Spec:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(f"chip file {path}: not found") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"chip file {path}: not valid TOML ({e})") from None
    return _parse(data, path)


@functools.lru_cache(maxsize=None)
def catalog() -> dict[str, Spec]:
    """Every bundled spec, by id."""
    out = {}
    root = resources.files("solbound.hardware") / SPEC_DIR
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            spec = _parse(tomllib.loads(entry.read_text()), entry.name)
            out[spec.id] = spec
    return out


def load_spec(arch: str) -> Spec:
    """A catalog id (``h100-sxm``), ``host`` (the spec ``solbound calibrate`` measured on
    this machine) or a path to a spec TOML file; ``@CLOCK`` after any of them scales the
    compute peaks (``h100-sxm@1755MHz``, ``b200@datasheet``; default ``@max``)."""
    base, at, clock = arch.rpartition("@")
    if at and base and not clock.endswith(".toml") and os.path.sep not in clock:
        return load_spec(base).at_clock(parse_clock(clock))
    if arch.endswith(".toml") or os.path.sep in arch:
        return spec_from_file(arch)
    if arch.strip().lower() == "host":
        from ..paths import host_spec_path
        path = host_spec_path()
        if not os.path.exists(path):
            raise UnknownArch(f"--arch host: no host spec at {path}; run `solbound calibrate` "
                              f"first")
        return spec_from_file(path)
    cat = catalog()
    arch = arch.strip().lower()
    if arch not in cat:
        raise UnknownArch(f"unknown arch {arch!r}; known: {', '.join(sorted(cat))}")
    return cat[arch]


# CUDA device names (``torch.cuda.get_device_name``, ``nvidia-smi``) -> catalog id, first
# match wins; a variant the catalog lacks (H100 NVL, A100 PCIe) matches nothing
_DEVICE_NAMES = (
    (r"\bh100\b.*\bnvl\b", None), (r"\bh100\b.*\bpcie\b", "h100-pcie"), (r"\bh100\b", "h100-sxm"),
    (r"\bh200\b.*\bnvl\b", "h200-nvl"), (r"\bh200\b", "h200"), (r"\bb200\b", "b200"),
    (r"\bb300\b", "b300"), (r"\bh800\b", "h800"), (r"\bh20\b", "h20"),
    (r"\ba100\b.*\bsxm", "a100-sxm"), (r"\brtx a6000\b", "a6000"), (r"\brtx 4090\b", "rtx-4090"),
    (r"\brtx 5090\b", "rtx-5090"), (r"\brtx pro 6000\b", "rtx-pro-6000"),
    (r"\bl40s\b", "l40s"), (r"\bl40\b", "l40"), (r"\bl4\b", "l4"), (r"\ba10\b", "a10"),
    (r"\bt4\b", "t4"), (r"\bgb10\b", "gb10"),
    (r"\bmi300x\b", "mi300x"), (r"\bmi325x\b", "mi325x"), (r"\bmi350x\b", "mi350x"),
    (r"\bmi355x\b", "mi355x"), (r"\bthor\b", "jetson-thor"),
    (r"\borin nano\b", "jetson-orin-nano"), (r"\borin\b", "jetson-orin"),
)


def match_device(name: str) -> Spec | None:
    """The catalog entry for a device as CUDA names it, or ``None``.

    >>> [match_device(n).id for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
    ...  "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "NVIDIA B200",
    ...  "NVIDIA L4", "Tesla T4", "NVIDIA A10", "NVIDIA L40S", "NVIDIA H200 NVL")]
    ['h100-sxm', 'h100-pcie', 'h200', 'a100-sxm', 'rtx-4090', 'b200', 'l4', 't4', 'a10', 'l40s', 'h200-nvl']
    >>> match_device("NVIDIA H100 NVL") is None, match_device("Tesla V100-SXM2-16GB") is None
    (True, True)
    """
    import re
    low = name.lower()
    for pattern, arch in _DEVICE_NAMES:
        if re.search(pattern, low):
            return catalog().get(arch) if arch else None
    return None


def compare_specs(measured: Spec, reference: Spec) -> list[tuple[str, float, float]]:
    """``(key, measured, reference)`` for DRAM bandwidth, every peak and every on-chip
    level both specs list, in that order: how a calibrated device compares with its
    catalog entry (a peak from the fallback is the reference's own and is left out)."""
    rows = [("dram.bandwidth", measured.bandwidth, reference.bandwidth)]
    for pipe in sorted(measured.peaks):
        if pipe in reference.peaks and not measured.source(pipe).startswith("catalog "):
            rows.append((pipe, measured.peaks[pipe], reference.peaks[pipe]))
    for level in sorted(measured.onchip):
        if level in reference.onchip:
            rows.append((f"onchip.{level}", measured.onchip[level], reference.onchip[level]))
    return rows


def parse_archs(text: str | None) -> list[Spec]:
    if not text:
        return [load_spec(a) for a in DEFAULT_ARCHS]
    if text.strip() == "all":
        return list(catalog().values())
    return [load_spec(a.strip()) for a in text.split(",") if a.strip()]
