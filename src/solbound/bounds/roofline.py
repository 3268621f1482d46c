"""Roofline bounds per chip and fidelity, with the precision policy.

``T = max(T_compute, T_memory)``; ``T_memory = bytes / DRAM bandwidth``;
``T_compute = max over pipes (work on that pipe / its peak)``: pipes run
concurrently, so the max is a lower bound.

Which pipe a kernel's work runs on follows what PyTorch does by default (the
*precision policy*): fp32 matmuls on the vector FP32 pipe (no TF32,
``torch.backends.cuda.matmul.allow_tf32 = False``), fp32 convolutions and
attention on TF32 tensor cores (``torch.backends.cudnn.allow_tf32 = True``),
fp16/bf16 contractions on tensor cores at their dtype's rate. Vector work runs
on the vector pipe of its dtype; transcendental functions that map to the
special-function unit (MUFU) load that pipe, one op each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.counts import KernelCounts, ProgramCounts
from ..hardware.catalog import Spec

DEFAULT_POLICY = {
    ("matmul", "f32"): "fp32", ("conv", "f32"): "tf32", ("attention", "f32"): "tf32",
}
CLASSES = ("matmul", "conv", "attention")
MATRIX_PIPE = {"f16": "tensor_fp16", "bf16": "tensor_bf16", "f64": "tensor_fp64",
               "i8": "tensor_int8", "u8": "tensor_int8", "f8e4m3": "tensor_fp8",
               "f8e5m2": "tensor_fp8", "f8e4m3fnuz": "tensor_fp8", "f8e5m2fnuz": "tensor_fp8",
               "f4e2m1x2": "tensor_fp4"}
VECTOR_PIPE = {"f64": "vector_fp64", "f16": "vector_fp16", "bf16": "vector_bf16"}
# pipes to try, in order, when a chip lacks one (each substitution is reported)
FALLBACK = {
    "vector_bf16": ["vector_fp16", "vector_fp32"],
    "vector_fp16": ["vector_fp32"],
    "vector_fp64": ["tensor_fp64", "vector_fp32"],
    "tensor_fp64": ["vector_fp64"],
    "tensor_tf32": ["vector_fp32", "tensor_bf16"],
    "vector_fp32": ["tensor_tf32", "tensor_bf16"],
    "tensor_fp8": ["tensor_fp16", "tensor_bf16"],
    "tensor_fp4": ["tensor_fp8", "tensor_fp16", "tensor_bf16"],
    "tensor_int8": ["tensor_fp16", "tensor_bf16"],
    "tensor_fp16": ["tensor_bf16"],
    "tensor_bf16": ["tensor_fp16"],
    "sfu": ["vector_fp32", "tensor_bf16"],
}


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Policy:
    """fp32 contraction class -> ``fp32`` (vector pipe) or ``tf32`` (tensor cores)."""

    fp32: dict[str, str] = field(default_factory=lambda: {c: DEFAULT_POLICY[(c, "f32")]
                                                          for c in CLASSES})

    @staticmethod
    def parse(text: str | None) -> "Policy":
        """``default``, ``tf32`` / ``fp32`` (all classes), or ``matmul=tf32,conv=fp32``."""
        p = dict(Policy().fp32)
        if not text or text == "default":
            return Policy(p)
        for part in text.split(","):
            part = part.strip()
            if part in ("tf32", "fp32", "bf16"):
                p = {c: part for c in CLASSES}
                continue
            key, eq, val = part.partition("=")
            if not eq or key not in CLASSES or val not in ("tf32", "fp32", "bf16"):
                raise PolicyError(f"bad precision policy {part!r}: use default, tf32, fp32, bf16 "
                                  f"or CLASS=tf32|fp32|bf16 with CLASS in {', '.join(CLASSES)}")
            p[key] = val
        return Policy(p)

    def describe(self) -> str:
        names = {"tf32": "TF32 tensor cores", "bf16": "bf16 tensor cores (operands rounded)",
                 "fp32": "FP32 vector pipe"}
        return ", ".join(f"fp32 {c}: {names.get(v, v)}" for c, v in self.fp32.items())

    def matrix_pipe(self, cls: str, dtype: str) -> str:
        if dtype == "f32":
            return {"tf32": "tensor_tf32", "bf16": "tensor_bf16"}.get(self.fp32.get(cls, "fp32"),
                                                                      "vector_fp32")
        return MATRIX_PIPE.get(dtype, "vector_fp32")


def kernel_pipe_work(k: KernelCounts, policy: Policy) -> dict[str, float]:
    """Work (ops) this kernel puts on each pipe."""
    work: dict[str, float] = {}

    def put(pipe: str, n: float) -> None:
        if n:
            work[pipe] = work.get(pipe, 0.0) + n
    if k.flops.get("matrix"):
        put(policy.matrix_pipe(k.matrix_class, k.dtype), k.flops["matrix"])
    vpipe = VECTOR_PIPE.get(k.dtype, "vector_fp32")
    put(vpipe, k.flops.get("vector", 0))
    sfu = k.points * k.sfu_per_point
    put("sfu", sfu)
    # special functions without a MUFU instruction (erf, atan, ...) run on the vector pipe
    put(vpipe, k.flops.get("special", 0) - sfu)
    return work


def kernel_special_ops(k: KernelCounts) -> dict[str, float]:
    """The kernel's SFU ops by function (``exp``: how many): its ``sfu`` work, named."""
    return {f: float(k.points * n) for f, n in k.sfu_ops.items() if n}


def work_of(kernels, policy: Policy, scale=None) -> tuple[dict[str, float], dict[str, float]]:
    """``(work per pipe, SFU ops per function)`` of some kernels (``scale``: kernel name ->
    factor on its work), what :func:`_compute` takes."""
    work: dict[str, float] = {}
    special: dict[str, float] = {}
    for k in kernels:
        f = scale.get(k.name, 1.0) if scale else 1.0
        for p, n in kernel_pipe_work(k, policy).items():
            work[p] = work.get(p, 0.0) + n * f
        for fn, n in kernel_special_ops(k).items():
            special[fn] = special.get(fn, 0.0) + n * f
    return work, special


def resolve_peak(spec: Spec, pipe: str) -> tuple[str, float, str]:
    """(pipe used, peak, note); the note names any substitution."""
    if spec.peak(pipe):
        return pipe, spec.peak(pipe), ""
    for alt in FALLBACK.get(pipe, []):
        if spec.peak(alt):
            return alt, spec.peak(alt), f"{spec.id} has no {pipe} peak: {alt} used"
    best = max(spec.peaks.items(), key=lambda kv: kv[1])
    return best[0], best[1], f"{spec.id} has no {pipe} peak: its highest peak ({best[0]}) used"


@dataclass
class Bound:
    arch: str
    mode: str
    seconds: float
    compute_seconds: float
    memory_seconds: float
    bound: str
    bytes: int
    flops: int
    intensity: float
    pipe_seconds: dict[str, float]
    peaks: dict[str, float]
    bandwidth: float
    notes: list[str]
    serial_seconds: float | None = None
    # physical unit -> seconds (the sum over the pipes that run on it); T_compute is the max
    unit_seconds: dict[str, float] = field(default_factory=dict)
    cache_bytes: int | None = None       # the on-chip capacity a cache-aware bound assumes
    explanation: str = ""                # how the fidelity arrived at its bytes
    detail: object = field(default=None, repr=False)
    # communication (``bounds/comm.py``): the rank's collectives over its link; ``seconds``
    # is max(compute, memory, communication), ``no_overlap_seconds`` the time without
    # overlapping communication (max(compute, memory) + communication)
    comm_seconds: float = 0.0
    link_bandwidth: float = 0.0
    no_overlap_seconds: float | None = None
    # special functions moved from the SFU to an FMA-pipe emulation: function -> ops
    # (``bounds/special.py``)
    emulated: dict[str, float] = field(default_factory=dict)

    @property
    def binding_unit(self) -> str:
        """The unit with the most work (what bounds compute)."""
        return max(self.unit_seconds, key=self.unit_seconds.get) if self.unit_seconds else ""


def _compute(work: dict[str, float], spec: Spec, notes: list[str],
             special: dict[str, float] | None = None,
             emulated: dict[str, float] | None = None) -> tuple[float, dict, dict, dict]:
    """(T_compute, seconds per pipe, peaks used, seconds per physical unit). Pipes on one
    unit add up; units run concurrently, so T_compute is the max over units. ``special``
    (the SFU work by function): the special functions are split optimally between the SFU
    and an emulation on the FMA pipes (``bounds/special.py``); what moved is added to
    ``emulated`` and said in ``notes``."""
    per_pipe: dict[str, float] = {}
    peaks: dict[str, float] = {}
    per_unit: dict[str, float] = {}
    for pipe, n in sorted(work.items()):
        used, peak, note = resolve_peak(spec, pipe)
        if note and note not in notes:
            notes.append(note)
        per_pipe[used] = per_pipe.get(used, 0.0) + n / peak
        peaks[used] = peak
        unit = spec.unit_of(used)
        per_unit[unit] = per_unit.get(unit, 0.0) + n / peak
    if special:
        _split_special(special, spec, per_pipe, peaks, per_unit, notes, emulated)
    return (max(per_unit.values()) if per_unit else 0.0), per_pipe, peaks, per_unit


def _split_special(special, spec: Spec, per_pipe, peaks, per_unit, notes, emulated) -> None:
    """Move special functions from the SFU to an FMA-pipe emulation where that lowers
    ``max(SFU, vector)`` time (in place)."""
    from .special import describe, split
    p_s, p_v = spec.peak("sfu"), spec.peak("vector_fp32")
    if not p_s or not p_v or "sfu" not in per_pipe:
        return
    u_s, u_v = spec.unit_of("sfu"), spec.unit_of("vector_fp32")
    moved, _, added = split(special, p_s, p_v / 2, per_unit.get(u_v, 0.0), same_unit=u_s == u_v)
    if not moved:
        return
    saved = sum(moved.values()) / p_s
    per_pipe["sfu"] -= saved
    per_unit[u_s] -= saved
    per_pipe["vector_fp32"] = per_pipe.get("vector_fp32", 0.0) + added
    per_unit[u_v] = per_unit.get(u_v, 0.0) + added
    peaks["vector_fp32"] = p_v
    if notes is not None:
        note = f"{spec.id}: {describe(moved, special)}"
        if note not in notes:
            notes.append(note)
    if emulated is not None:
        for f, n in moved.items():
            emulated[f] = emulated.get(f, 0.0) + n


def work_bound(work: dict[str, float], special: dict[str, float], nbytes: int, flops: int,
               spec: Spec, mode: str, explanation: str = "", collectives=()) -> Bound:
    """The roofline of some work per pipe (``special``: its SFU ops by function) and
    ``nbytes`` of DRAM traffic on ``spec``: what :func:`program_bounds` computes for one
    fidelity, for callers that sum work themselves (a serving step composed of sequences);
    ``collectives`` (``analysis.counts.Collective``-like: ``kind``, ``members``, ``bytes``,
    ``perm``, ``calls``, ``ranks``) add their link time as :func:`program_bounds` does.

    >>> from solbound.hardware.catalog import load_spec
    >>> b = work_bound({"tensor_bf16": 989.4e12}, {}, 0, 989_400_000_000_000,
    ...                load_spec("h100-sxm"), "fused")
    >>> round(b.seconds, 6), b.bound
    (1.0, 'compute')
    """
    notes: list[str] = [spec.clock_note()] if spec.clock_note() else []
    emulated: dict[str, float] = {}
    t_c, per_pipe, peaks, per_unit = _compute(work, spec, notes, special, emulated)
    t_m = nbytes / spec.bandwidth
    b = Bound(spec.id, mode, max(t_c, t_m), t_c, t_m, "compute" if t_c >= t_m else "memory",
              nbytes, flops, flops / nbytes if nbytes else float("inf"), per_pipe, peaks,
              spec.bandwidth, notes, None, per_unit, None, explanation)
    b.emulated = emulated
    if collectives:
        from .comm import comm_time
        _with_comm(b, comm_time(collectives, spec))
    return b


def _with_comm(b: Bound, comm) -> None:
    """``b`` with its rank's communication: overlapped in ``seconds`` (the max), added in
    ``no_overlap_seconds`` (and ``serial_seconds``)."""
    t = b.seconds
    b.comm_seconds, b.link_bandwidth = comm.seconds, comm.link_bandwidth
    b.no_overlap_seconds = t + comm.seconds
    if comm.seconds > t:
        b.seconds, b.bound = comm.seconds, "communication"
    if b.serial_seconds is not None:
        b.serial_seconds += comm.seconds


def program_bounds(pc: ProgramCounts, spec: Spec, policy: Policy, graph=None,
                   cache=None, memo: dict | None = None, modes=None) -> list[Bound]:
    """One bound per fidelity (``bounds/fidelity.py``; ``modes``: only those); a fidelity
    that needs the graph is skipped without one."""
    from .fidelity import FIDELITIES, FidelityInput
    work, special = work_of(pc.kernels, policy)
    notes: list[str] = [spec.clock_note()] if spec.clock_note() else []
    emulated: dict[str, float] = {}
    t_c, per_pipe, peaks, per_unit = _compute(work, spec, notes, special, emulated)
    total_flops = sum(pc.flops.values())
    comm = None
    if pc.collectives:
        from .comm import comm_time
        comm = comm_time(pc.collectives, spec)
    out = []
    x = FidelityInput(pc, graph, spec, cache, memo if memo is not None else {})
    for mode, fid in FIDELITIES.items():
        if graph is None and mode not in ("unfused", "fused") or modes and mode not in modes:
            continue
        traffic = fid.traffic(x)
        t_m = traffic.bytes / spec.bandwidth
        serial = None
        if fid.serial:
            serial = 0.0
            for g in pc.groups:
                gw, gs = work_of([pc.kernels[i] for i in g.kernels], policy)
                serial += max(_compute(gw, spec, [], gs)[0], g.traffic.bytes / spec.bandwidth)
        t = max(t_c, t_m)
        b = Bound(spec.id, mode, t, t_c, t_m, "compute" if t_c >= t_m else "memory",
                  traffic.bytes, total_flops,
                  total_flops / traffic.bytes if traffic.bytes else float("inf"),
                  per_pipe, peaks, spec.bandwidth, list(notes), serial, per_unit,
                  traffic.cache_bytes, traffic.explanation, traffic.detail)
        b.emulated = dict(emulated)
        if comm:
            _with_comm(b, comm)
        out.append(b)
    return out


def group_seconds(pc: ProgramCounts, spec: Spec, policy: Policy) -> list[tuple[float, float, float]]:
    """Per framework operator: (time, compute, memory) in the unfused model."""
    res = []
    for g in pc.groups:
        gw, gs = work_of([pc.kernels[i] for i in g.kernels], policy)
        c = _compute(gw, spec, [], gs)[0]
        m = g.traffic.bytes / spec.bandwidth
        res.append((max(c, m), c, m))
    return res
