"""Structural checks of a :class:`~solbound.ir.model.Program` (no execution)."""

from __future__ import annotations

from .affine import Aff, split_quot
from .model import EXTERNAL_ROLES, Access, Idx, Program, walk


class IRError(ValueError):
    """A structurally invalid program (undeclared tensor, unknown loop variable, ...)."""


def check_program(p: Program) -> None:
    tensors = p.tensor_map
    written: set[str] = set()
    for k in p.kernels:
        dims = k.count_extents
        where = f"kernel {k.name}"
        if k.loop is not None and k.loop[0] in k.extents:
            raise IRError(f"{where}: loop variable {k.loop[0]!r} is also a kernel dimension")

        def check_aff(a: Aff, ctx: str) -> None:
            for v in a.vars:
                q = split_quot(v) if ctx == "the guard" else None
                if (q[0] if q else v) not in dims:
                    raise IRError(f"{where}: {ctx} uses {v!r}, not a loop dimension")

        target = Access(k.out, k.out_index)
        for acc in [x for e in (target, k.body) for x in walk(e) if isinstance(x, Access)]:
            if acc.tensor not in tensors:
                raise IRError(f"{where}: unknown tensor {acc.tensor!r}")
            if len(acc.index) != len(tensors[acc.tensor].shape):
                raise IRError(f"{where}: {acc.tensor} has rank {len(tensors[acc.tensor].shape)}, "
                              f"indexed with {len(acc.index)}")
            for i in acc.index:
                if isinstance(i, Aff):
                    check_aff(i, f"index of {acc.tensor}")
        if k.scatter:
            if k.guard or k.scan is not None or k.out2 is not None \
                    or k.reduce not in (None, "sum", "prod", "max", "min"):
                raise IRError(f"{where}: a scatter (indirect output index) overwrites or "
                              f"combines with sum/prod/max/min, without guard, scan or second output")
            if k.out not in written and tensors[k.out].role not in EXTERNAL_ROLES:
                raise IRError(f"{where}: scatters into {k.out} before any kernel writes it")
        reads = [x for x in walk(k.body)] + [x for i in k.out_index if isinstance(i, Access)
                                             for x in walk(i)]
        for x in reads:
            if isinstance(x, Idx):
                check_aff(x.expr, "a value")
            if isinstance(x, Access) and x.tensor not in written \
                    and tensors[x.tensor].role not in EXTERNAL_ROLES:
                raise IRError(f"{where}: reads {x.tensor} before any kernel writes it")
        for atom in k.guard:
            check_aff(atom.expr, "the guard")
        for atom in k.skip:
            check_aff(atom.expr, "the skipped region")
        if k.skip and (k.scatter or k.lib or k.scan is not None):
            raise IRError(f"{where}: a scatter, library kernel or scan skips no points")
        if k.scan is not None and k.scan not in dims:
            raise IRError(f"{where}: scan dimension {k.scan!r} is not a loop dimension")
        for o in k.outputs:
            # DRAM state may be updated in place (a KV-cache buffer, a mutated input);
            # parameters and constants are read-only
            if tensors[o].role in ("parameter", "constant"):
                raise IRError(f"{where}: writes {o}, a {tensors[o].role}")
            written.add(o)
    for t in p.tensors:
        if t.role == "output" and t.name not in written:
            raise IRError(f"output {t.name} is never written")
