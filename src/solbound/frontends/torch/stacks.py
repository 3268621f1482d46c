"""Repeated structure traced once: a stack of identical layers becomes one IR loop.

Tracing unrolls a Python loop over an ``nn.ModuleList``: every layer is exported,
decomposed, lowered and counted again, so a model's analysis time grows with its depth
(Llama-3-70B's 80 layers). Here:

1. ``find_stacks`` finds the ``nn.ModuleList``/``nn.Sequential`` whose layers are one
   structure repeated with some period ``p`` (same classes, parameter and buffer shapes and
   dtypes, plain attributes; an attribute equal to the layer's own index, such as
   ``layer_idx``, may differ): decoders of one layer kind have ``p = 1``, alternating
   sliding and full attention ``p = 2``.
2. ``truncated`` holds two periods of each stack while the model is traced (and a config's
   layer count and per-layer lists, where the model reads them).
3. ``reroll_stacks`` finds the kernels of each traced layer (by the module path the export
   records), folds the two periods into one sequential loop with ``ir.reroll`` and runs it
   ``L / p`` times: parameters stacked per layer, the residual stream carried, a KV cache
   kept per layer. The claim that the untraced layers are the same program as the traced
   ones is stated in the report's notes; validation runs the rerolled IR against the whole
   model.

Whatever does not reroll (copies that differ, a layer's output read from outside the
stack) is named in one note, and the whole model is traced as before.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from dataclasses import dataclass, replace

from ...ir.model import kernel_reads
from ...ir.text import fresh_name
from ...ir.reroll import RerollError, reroll

_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class Stack:
    path: str          # qualified name of the ModuleList in the model
    length: int        # layers it holds
    period: int        # layers per loop iteration
    lead: int = 0      # layers traced before the loop (the first, when it reads an input)
    tail: int = 0      # layers traced after it (the last, when it writes an output)

    @property
    def traced(self) -> int:
        return self.lead + 2 * self.period + self.tail

    @property
    def trip(self) -> int:
        return (self.length - self.lead - self.tail) // self.period


def _attrs(layer) -> dict[tuple[str, str], object]:
    """Plain attributes of a layer's modules: (submodule, attribute) -> value."""
    return {(name, k): v for name, m in layer.named_modules() for k, v in vars(m).items()
            if not k.startswith("_") and isinstance(v, _PLAIN)}


def _signature(layer, skip: set) -> tuple:
    """What makes two layers the same program: classes, parameter and buffer shapes,
    dtypes and grad flags, plain attributes (but ``skip``: the layer's own index),
    submodule by submodule."""
    attrs = _attrs(layer)
    sig = []
    for name, m in layer.named_modules():
        params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                       for n, p in m.named_parameters(recurse=False))
        bufs = tuple((n, tuple(b.shape), str(b.dtype))
                     for n, b in m.named_buffers(recurse=False) if b is not None)
        sig.append((name, type(m).__qualname__, params, bufs))
    return tuple(sig) + tuple(sorted((k, repr(v)) for k, v in attrs.items() if k not in skip))


def find_stacks(model, max_period: int = 8) -> list[Stack]:
    """The outermost module lists whose layers repeat with a period ``p`` and hold more
    than two periods. An integer attribute equal to each layer's own position (a
    ``layer_idx``) is the one thing allowed to differ."""
    import torch.nn as nn
    stacks: list[Stack] = []
    for path, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or not path:
            continue
        if any(path.startswith(s.path + ".") for s in stacks):
            continue
        layers = list(m)
        n = len(layers)
        if n < 3:
            continue
        attrs = [_attrs(layer) for layer in layers]
        index = {key for key in attrs[0]
                 if all(type(a.get(key)) is int and a.get(key) == i for i, a in enumerate(attrs))}
        sigs = [_signature(layer, index) for layer in layers]
        for p in range(1, min(max_period, n // 2) + 1):
            if n % p == 0 and n > 2 * p and all(sigs[i] == sigs[i % p] for i in range(n)):
                stacks.append(Stack(path, n, p))
                break
    return stacks


def _configs(model) -> list:
    """Config objects the model's modules hold (transformers' ``config``), with their
    sub-configs."""
    seen: dict[int, object] = {}
    todo = [getattr(m, "config", None) for m in model.modules()]
    while todo:
        c = todo.pop()
        if c is None or id(c) in seen or not hasattr(c, "to_dict"):
            continue
        seen[id(c)] = c
        todo.extend(v for v in vars(c).values() if hasattr(v, "to_dict"))
    return list(seen.values())


@contextlib.contextmanager
def truncated(model, stacks: list[Stack]):
    """Each stack holds its first two periods inside the block; a config's layer count
    equal to a stack's length, and its per-layer lists, follow (a model may size its cache
    or slice its layers by them). Everything is put back afterwards.

    transformers records per-layer outputs (``output_hidden_states``, a VLM's vision
    feature layer) with hooks it installs once, on the layers present at the first call:
    they are installed on the whole model first, or the layers held outside during this
    trace would never record again (LLaVA's vision tower then returned no hidden states)."""
    _install_output_hooks(model)
    saved = []
    try:
        for s in stacks:
            ml = model.get_submodule(s.path)
            saved.append((ml, "_modules", ml._modules))
            ml._modules = OrderedDict(list(ml._modules.items())[: s.traced])
            for cfg in _configs(model):
                for k, v in list(vars(cfg).items()):
                    if "layer" not in k.lower():
                        continue
                    if type(v) is int and v == s.length:
                        saved.append((cfg, k, v))
                        setattr(cfg, k, s.traced)
                    elif isinstance(v, (list, tuple)) and len(v) == s.length:
                        saved.append((cfg, k, v))
                        setattr(cfg, k, type(v)(v[: s.traced]))
        yield
    finally:
        for obj, k, v in reversed(saved):
            if k == "_modules":
                obj._modules = v
            else:
                setattr(obj, k, v)


def _install_output_hooks(model) -> None:
    """transformers' output-capturing hooks on every layer of ``model`` (see
    :func:`truncated`); nothing for other models or older releases."""
    try:
        from transformers.utils.output_capturing import maybe_install_capturing_hooks
    except ImportError:
        return
    for m in model.modules():
        if getattr(m, "_can_record_outputs", None) and hasattr(m, "config"):
            try:
                maybe_install_capturing_hooks(m)
            except Exception:  # noqa: BLE001 - a model transformers cannot hook: as before
                pass


def _layer_of(name: str, path: str) -> int | None:
    """The layer of the stack at ``path`` that a module, parameter or optimizer-state name
    (``optimizer.<param>.<key>``) belongs to."""
    from .lower import OPT_PREFIX
    if name.startswith(OPT_PREFIX):
        name = name[len(OPT_PREFIX):]
    m = re.match(re.escape(path) + r"\.(\d+)(\.|$)", name)
    return int(m.group(1)) if m else None


def _at_layer(name: str, path: str, layer) -> str:
    """``name`` with the layer of the stack at ``path`` replaced by ``layer``."""
    return re.sub(re.escape(path) + r"\.\d+", f"{path}.{layer}", name, count=1)


def _noted(lowered, *notes: str):
    """``lowered`` with ``notes`` added to its program's notes."""
    p = lowered.program
    lowered.program = p.__class__(p.tensors, p.kernels, p.notes + notes)
    return lowered


def _advance(names: list[str], n: int) -> list[str]:
    """``n`` names continuing the progression of the first two (their one differing
    number advances by a fixed step): ``layers.0.w``, ``layers.1.w`` -> ``layers.i.w``.

    >>> _advance(['m.layers.1.w', 'm.layers.3.w'], 3)
    ['m.layers.1.w', 'm.layers.3.w', 'm.layers.5.w']
    """
    a, b = re.split(r"(\d+)", names[0]), re.split(r"(\d+)", names[1])
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y] if len(a) == len(b) else []
    if len(diff) != 1 or diff[0] % 2 == 0:
        raise RerollError(f"{names[0]!r} and {names[1]!r} differ in more than one number")
    i = diff[0]
    start, step = int(a[i]), int(b[i]) - int(a[i])
    return ["".join(a[:i] + [str(start + c * step)] + a[i + 1:]) for c in range(n)]


def reroll_stacks(lowered, stacks: list[Stack], look=None):
    """``lowered`` (traced with ``truncated``) with each stack's two traced periods folded
    into one loop of ``length / period`` iterations. Raises ``RerollError``.
    ``look(target)``: a constant's real value (per-layer constants lifted with a running
    counter are taken for every layer when the traced layers' values are equal)."""
    if lowered.random_draws:
        raise RerollError("the program draws random numbers (each layer's draws differ)")
    if lowered.unsupported:
        raise RerollError("the program has unsupported operators")
    notes = []
    for s in stacks:
        p = lowered.program
        owner: dict[int, int] = {}
        for pos, k in enumerate(p.kernels):
            layer = _layer_of(lowered.groups.get(k.op, {}).get("module", ""), s.path)
            if layer is not None and s.lead <= layer < s.traced - s.tail:
                owner[pos] = (layer - s.lead) // s.period
        if len(set(owner.values())) != 2:
            raise RerollError(f"{s.path}: no kernel is attributed to its layers")
        p = _gather(p, owner)
        lowered = replace(lowered, program=p)
        first = min(owner)
        n0 = sum(1 for c in owner.values() if c == 0)
        n1 = len(owner) - n0
        copies = [list(range(first, first + n0)), list(range(first + n0, first + n0 + n1))]
        new, info = reroll(p, copies, trip=s.trip, var="layer")
        _chain(info, s)
        lowered = _remap(lowered, new, info, s, look)
        if s.tail:
            # the layers traced after the loop stand for the stack's last layers
            shift = s.length - s.traced

            def last(t: str) -> str:
                i = _layer_of(t, s.path)
                if i is None or i < s.traced - s.tail:
                    return t
                return _at_layer(t, s.path, i + shift)
            lowered.state = [dict(st, target=last(st["target"])) if not st.get("stacked") else st
                             for st in lowered.state]
        notes.append(f"{s.path}: {s.length} layers of one structure"
                     + (f" (period {s.period})" if s.period > 1 else "")
                     + f"; {s.traced} traced and rerolled into a loop of {s.trip} iterations"
                     + (" (the first and the last layer outside it)" if s.lead and s.tail else
                        " (the first layer outside it)" if s.lead else
                        " (the last layer outside it)" if s.tail else "")
                     + "; the others are taken to be the same program: same classes, "
                       "parameter shapes and attributes")
    return _noted(lowered, *notes)


def _chain(info, s: Stack) -> None:
    """The layers run one after another, each on the previous one's value: only then is
    every layer of the list known to run (experts in a list run as the routing decides,
    and truncating them hides the ones a trace did not reach)."""
    if not info.carried:
        raise RerollError(f"{s.path}: its layers are not a chain (no value is carried from "
                          f"one to the next)")


def _gather(p, owner: dict[int, int]):
    """``p`` with the kernels of each copy (``owner``: position -> copy) made consecutive,
    copy 0 first, where only independent kernels change order (a cache's output copy that
    the lowering placed at the end of the program moves back into its layer)."""
    ks = list(p.kernels)
    first = min(owner)
    order = ([i for i in range(first) if i not in owner]
             + [i for c in (0, 1) for i in sorted(owner) if owner[i] == c]
             + [i for i in range(first, len(ks)) if i not in owner])
    if order == list(range(len(ks))):
        return p
    rw = []
    for k in ks:
        reads = {a.tensor for a in kernel_reads(k)}
        rw.append((reads, set(k.outputs)))
    where = {i: n for n, i in enumerate(order)}
    moved = [i for i in range(len(ks)) if where[i] != i]
    for a in moved:
        for b in range(len(ks)):
            if a != b and (a < b) != (where[a] < where[b]):
                (ra, wa), (rb, wb) = rw[a], rw[b]
                if wa & (rb | wb) or wb & ra:
                    raise RerollError(f"kernel {ks[a].name} of a layer cannot move next to its "
                                      f"layer's other kernels (it depends on {ks[b].name})")
    return p.__class__(p.tensors, tuple(ks[i] for i in order), p.notes)


def _equal_values(look, targets: list[str]) -> bool:
    """The constants ``targets`` hold the same values (their real values, as validation
    would read them, through ``look``; False when they cannot be read)."""
    import torch
    if look is None:
        return False
    try:
        vals = [look(t) for t in targets]
    except Exception:  # noqa: BLE001 - a value that cannot be read: not known equal
        return False
    from .reference import _is_abstract
    if any(not isinstance(v, torch.Tensor) or _is_abstract(v) for v in vals):
        return False
    return all(v.shape == vals[0].shape and v.dtype == vals[0].dtype and torch.equal(v, vals[0])
               for v in vals[1:])


def _remap(lowered, program, info, s: Stack, look=None):
    """The frontend facts of ``lowered`` for the rerolled ``program``."""
    trip = info.trip
    tensors = program.tensor_map
    member_of = {m: (new, c) for new, ms in {**info.stacked, **info.kept}.items()
                 for c, m in enumerate(ms)}
    target_of = {st["ir"]: st["target"] for st in lowered.state}
    state = []
    done = set()
    for st in lowered.state:
        if st["ir"] not in member_of:
            state.append(st)
            continue
        new, _ = member_of[st["ir"]]
        if new in done:
            continue
        done.add(new)
        targets = [target_of[m] for m in info.stacked[new]]
        try:
            every = _advance(targets, trip)
        except RerollError:
            # constants lifted with a running counter (a routing assumption's:
            # ``...layers.0.mlp.gate.lifted_tensor_0``, ``...layers.1...lifted_tensor_18``)
            # name no progression; equal in the traced layers, every layer takes theirs
            if st["role"] not in ("constant", "assumed") or not _equal_values(look, targets):
                raise
            every = [targets[c % len(targets)] for c in range(trip)]
        state.append({"ir": new, "role": st["role"], "target": every, "stacked": True})
    for t in info.removed:
        if any(st.get("ir") == t for st in state):
            raise RerollError(f"{t}: state the loop no longer holds")
    # outputs: each run of copy 0's outputs is followed by the same run of copy 1's (a
    # cache: one block per layer; a training step: the state, then the parameters)
    outs = list(lowered.outputs)
    for i, o in enumerate(outs):
        if o.get("ir") in info.removed and o.get("ir") not in member_of:
            raise RerollError(f"output {o.get('path') or o.get('target') or o['ir']} is a "
                              f"layer's value the loop does not keep")
    # an output the loop does not hold may sit inside each layer's block, at the same
    # place in both traced blocks (a sliding-window cache's length, computed outside the
    # layers' chain from values every layer shares): it repeats with the block ("W"), the
    # first layer's value standing for every layer's, as the untraced layers' claim says
    copy_of = [member_of[o["ir"]][1] if o.get("ir") in member_of
               else "W" if o.get("ir") in tensors else -1 for o in outs]
    if sum(c == 0 for c in copy_of) != sum(c == 1 for c in copy_of) or \
            any(isinstance(c, int) and c > 1 for c in copy_of):
        raise RerollError("the layers' outputs are not one block per traced layer")
    runs = []
    i = 0
    while i < len(outs):
        if copy_of[i] != 0:
            if copy_of[i] == 1:
                raise RerollError("a layer's output comes before the first layer's")
            i += 1
            continue
        j = i
        while j < len(outs) and copy_of[j] in (0, "W"):
            j += 1
        n = j - i
        if copy_of[j:j + n] != [1 if c == 0 else c for c in copy_of[i:j]]:
            raise RerollError("the layers' outputs are not one block per layer")
        runs.append((i, n))
        i = j + n
    extra_t, extra_k = [], []
    taken = set(tensors) | {k.name for k in program.kernels}
    loop_t = set(member_of) | set(info.stacked) | set(info.kept)

    def outside(o0, o1) -> list[str]:
        """A value the loop does not hold ("W"), one tensor per layer: the two traced
        layers' own, and for each untraced one a copy of the first's writers (which read
        only what every layer shares, or the claim would not hold)."""
        src = o0["ir"]
        if o1["ir"] == src:                      # one tensor every layer returns
            return [src] * trip
        writers = [k for k in program.kernels if src in k.outputs]
        what = o0.get("path") or src
        if not writers:
            raise RerollError(f"output {what} of a layer is a value no kernel writes")
        for k in writers:
            if k.out2 is not None or k.loop is not None or \
                    any(a.tensor in loop_t or a.tensor == src for a in kernel_reads(k)):
                raise RerollError(f"output {what} of a layer is computed outside the loop "
                                  f"from a layer's values")
        names = [src, o1["ir"]]
        for c in range(2, trip):
            name = fresh_name(f"{src}_layer{c}", taken)
            extra_t.append(replace(tensors[src], name=name))
            extra_k.extend((k.name, k.with_(name=fresh_name(f"{k.name}_layer{c}", taken),
                                            out=name)) for k in writers)
            names.append(name)
        return names

    for first, n in reversed(runs):
        # per output of a layer: its tensor (one per layer for a value outside the loop),
        # one layer's elements, its path and target for every layer
        leaves = []
        for o0, o1 in zip(outs[first:first + n], outs[first + n:first + 2 * n]):
            names = {key: _advance([o0[key], o1[key]], trip) for key in ("path", "target")
                     if o0.get(key) and o1.get(key) and o0[key] != o1[key]}
            if o0["ir"] in member_of:
                new = member_of[o0["ir"]][0]
                leaves.append((o0, [new] * trip, tensors[new].numel // trip, names))
            else:
                leaves.append((o0, outside(o0, o1), 0, names))
        new_block = [dict(o0, ir=new[c], offset=o0.get("offset", 0) + c * per,
                          **{key: names[key][c] for key in names})
                     for c in range(trip) for o0, new, per, names in leaves]
        outs = outs[:first] + new_block + outs[first + 2 * n:]
    if extra_k:                # each copy right after the first layer's writer it copies
        ks = list(program.kernels)
        for orig, k in reversed(extra_k):
            ks.insert(next(i for i, x in enumerate(ks) if x.name == orig) + 1, k)
        program = program.__class__(tuple(program.tensors) + tuple(extra_t), tuple(ks),
                                    program.notes)
    used_ops = {k.op for k in program.kernels}
    body_ops = {k.op for k in program.kernels if k.loop and k.loop[2] == info.loop_id}
    groups = {}
    for op, g in lowered.groups.items():
        if op not in used_ops:
            continue
        if op in body_ops and g.get("module"):
            layer = _layer_of(g["module"], s.path)
            if layer is not None:
                star = "*" if s.period == 1 else f"{layer % s.period}::{s.period}"
                g = dict(g, module=_at_layer(g["module"], s.path, star))
        groups[op] = g
    return replace(lowered, program=program, state=state, outputs=outs, groups=groups,
                   values={}, partial=set(lowered.partial) - info.removed,
                   rerolled=list(lowered.rerolled) + [{
                       "module": s.path, "layers": s.length, "period": s.period,
                       "traced": s.traced, "trip": trip, "loop": info.var,
                       "body_kernels": len(info.body)}])


def _traced(model, stacks: list[Stack], capture, lowering, fold, timings: dict,
            retry: bool):
    """``lowering(capture())`` (the export of ``model``, then its IR) with each stack held to
    its traced layers and ``fold``ed into loops (``fold(lowered, stacks, look)``, ``look``
    a constant's real value by target); when that fails, the whole model's, with a
    note naming why. ``timings["export_s"]``: the seconds spent in ``capture``. ``retry``: a first layer that reads a program input or a last layer
    whose value is returned is traced outside the loop, and the others rerolled."""
    import time
    names = ", ".join(s.path for s in stacks)
    failure = None
    timings["export_s"] = 0.0

    def trace():
        t0 = time.perf_counter()
        try:
            ep = capture()
        finally:
            timings["export_s"] += time.perf_counter() - t0
        return ep, lowering(ep)
    for _ in range(3):
        if not stacks:
            break
        try:
            with truncated(model, stacks):
                ep, low = trace()
            from .reference import _state_value
            return ep, fold(low, stacks, lambda t, ep=ep: _state_value(model, t, ep))
        except RerollError as e:
            failure = str(e)
            grow = {"carry-in": "lead", "carry-out": "tail"}.get(e.kind) if retry else None
            if grow is None or any(getattr(s, grow) for s in stacks):
                break
            stacks = [replace(s, **{grow: s.period}) for s in stacks]
            stacks = [s for s in stacks if s.trip > 2]
        except Exception as e:  # noqa: BLE001 - the truncated model may not trace: trace all
            from ..loading import oneline
            failure = f"the model with {stacks[0].traced} of {stacks[0].length} layers does " \
                      f"not trace ({oneline(e)})"
            break
    ep, low = trace()
    if failure is not None:
        _noted(low, f"{names}: repeated layers not rerolled, every layer traced: {failure}")
    return ep, low


def export_and_lower(model, inputs: tuple, source: str, *, user_files=(), reroll_layers=True,
                     timings: dict | None = None, **export_kw):
    """``export_program`` then ``lower``, with each stack of repeated layers traced once
    (``reroll_layers``; see the module doc). Returns ``(ep, lowered)``; ``timings`` gets
    ``export_s``, the seconds spent tracing."""
    from .capture import export_program
    stacks = find_stacks(model) if reroll_layers else []
    return _traced(model, stacks, lambda: export_program(model, inputs, source, **export_kw),
                   _lowering(model, inputs, user_files), reroll_stacks,
                   {} if timings is None else timings, retry=True)


def _lowering(model, inputs: tuple, user_files):
    """The lowering of an export of ``model`` on ``inputs`` (the structure of its inputs and
    state read as it is when called: the stack held to its traced layers, or whole)."""
    from .capture import input_structure, state_structure
    from .lower import lower
    return lambda ep: lower(ep, user_files, input_structure(inputs), state_structure(model))


# --- the training step -------------------------------------------------------------------


def reroll_step(lowered, s: Stack):
    """A training step traced with ``truncated``: the forward's two traced layers, the
    backward's (which walks them in reverse) and the optimizer's updates of their
    parameters each become a loop, then every loop runs ``s.trip`` iterations
    (``ir.reroll.extend``). Module paths do not survive AOTAutograd, so each phase's two
    copies are found by structure (``ir.reroll.find_copies``) and checked by ``reroll``."""
    from ...ir.reroll import extend, find_copies
    if lowered.random_draws:
        raise RerollError("the step draws random numbers (each layer's draws differ)")
    if lowered.unsupported:
        raise RerollError("the step has unsupported operators")
    if s.lead or s.tail:
        raise RerollError("the first or last layer would have to stay outside the loop")
    infos = []
    for phase in ("forward", "backward", "optimizer"):
        p = lowered.program
        pos = [i for i, k in enumerate(p.kernels) if k.loop is None
               and lowered.groups.get(k.op, {}).get("phase") == phase]
        failure = None
        for copies in (find_copies(p, min(pos), max(pos) + 1) if pos else ()):
            try:
                new, info = reroll(p, copies, var="layer")
                if phase != "optimizer":
                    _chain(info, s)
                _aligned(info, lowered, s, phase)
                break
            except RerollError as e:
                failure = failure or e
        else:
            raise failure or RerollError(f"no two repeated layers found in the {phase}")
        lowered = replace(lowered, program=new)
        infos.append((phase, info))
    stacked = {n for _, i in infos for n in list(i.stacked) + list(i.kept)}
    carried = {n for _, i in infos for n in i.carried}
    program = extend(lowered.program, {i.loop_id for _, i in infos}, 2, s.trip, stacked,
                     carried)
    member = {}
    for _, info in infos:
        for new, ms in {**info.stacked, **info.kept, **info.carried}.items():
            for m in ms:
                member[m] = new
    removed = set().union(*(i.removed for _, i in infos))
    for phase, info in infos:
        info.trip = s.trip
        lowered = _remap(lowered, program, info, s)
        lowered.rerolled[-1]["phase"] = phase
    tr = dict(lowered.training or {})
    for key in ("trained", "stepped", "frozen", "unused"):
        if key in tr:
            tr[key] = _all_layers(tr[key], s)
    grads, rows = {}, {}
    traced_grads = tr.get("gradients") or {}
    for pname, ir in traced_grads.items():
        new = member.get(ir, ir)
        if new == ir:
            grads[pname], rows[pname] = ir, (ir, None)
            continue
        # the rows of a gradient the backward keeps per layer, in the order it walks them
        ms = next(ms for _, i in infos for n, ms in i.kept.items() if n == new)
        layers = [_layer_of(next(q for q, g in traced_grads.items() if g == m), s.path)
                  for m in ms]
        step = layers[1] - layers[0]
        start = layers[0] if step > 0 else layers[0] + s.length - s.traced
        for name in _all_layers([pname], s):
            grads[name] = new
            rows[name] = (new, (_layer_of(name, s.path) - start) // step)
    tr["gradients"] = grads
    tr["gradient_rows"] = rows
    tr["optimizer_state"] = list(dict.fromkeys(member.get(t, t)
                                               for t in tr.get("optimizer_state", [])))
    lowered.training = tr
    lowered.partial = set(lowered.partial) - removed
    return _noted(lowered, f"{s.path}: {s.length} layers of one structure; the step of "
                           f"{s.traced} traced and rerolled into forward, backward and "
                           f"optimizer loops of {s.trip} iterations (the others are taken to "
                           f"be the same program: same classes, parameter shapes and "
                           f"attributes)")


def _aligned(info, lowered, s: Stack, phase: str) -> None:
    """The two copies found by structure are two whole layers: the parameters they stack,
    the gradients, updated parameters and optimizer state they keep belong to one period
    of layers each, adjacent periods, copy by copy."""
    target = {st["ir"]: st["target"] for st in lowered.state if not st.get("stacked")}
    grad_of = {ir: p for p, ir in ((lowered.training or {}).get("gradients") or {}).items()}
    for o in lowered.outputs:        # an updated parameter or optimizer state
        if o.get("target") and o.get("ir"):
            target.setdefault(o["ir"], o["target"])
    named = [[target.get(m) or grad_of.get(m) for m in ms]
             for ms in list(info.stacked.values()) + list(info.kept.values())]
    named = [ns for ns in named if all(ns)]
    if not named:
        if phase == "optimizer":
            raise RerollError("the optimizer's copies update no layer's parameters")
        return
    blocks = set()
    for ns in named:
        layers = [_layer_of(n, s.path) for n in ns]
        if None in layers:
            raise RerollError(f"the {phase}'s copies hold {ns[0]}, which is no layer's")
        blocks.add(tuple(i // s.period for i in layers))
    if len(blocks) != 1 or abs(next(iter(blocks))[1] - next(iter(blocks))[0]) != 1:
        raise RerollError(f"the {phase}'s copies are not two whole layers")


def _all_layers(names: list[str], s: Stack) -> list[str]:
    """Names of the traced layers' parameters, for every layer of the stack."""
    out = []
    for n in names:
        i = _layer_of(n, s.path)
        if i is None:
            out.append(n)
        elif i < s.period:
            out += [_at_layer(n, s.path, i + c * s.period) for c in range(s.trip)]
    return out


def export_and_lower_step(model, inputs: tuple, source: str, *, user_files=(),
                          reroll_layers=True, timings: dict | None = None, **step_kw):
    """``export_train_step`` then ``lower``, with a stack of repeated layers traced for two
    layers and rerolled (:func:`reroll_step`); whatever does not reroll is traced whole
    with a note. ``timings`` gets ``export_s``."""
    from .train import export_train_step
    stacks = find_stacks(model) if reroll_layers else []
    ep, low = _traced(model, stacks if len(stacks) == 1 else [],
                      lambda: export_train_step(model, inputs, source, **step_kw),
                      _lowering(model, inputs, user_files),
                      lambda low, stacks, look: reroll_step(low, stacks[0]),
                      {} if timings is None else timings, retry=False)
    if len(stacks) > 1:
        _noted(low, f"{', '.join(s.path for s in stacks)}: repeated layers of the step not "
                    f"rerolled, every layer traced: more than one stack")
    return ep, low
