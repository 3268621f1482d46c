"""The training step as one exported program: forward, backward and optimizer.

The step is what one iteration of a training loop runs::

    loss = model(*inputs)            # or model(...).loss
    loss.backward()                  # gradients of every parameter that requires one
    optimizer.step()                 # torch.optim's own implementation

It is captured in three traces, each by PyTorch itself, and joined into one graph:

1. ``torch.export`` of the forward, ending at the scalar loss (``_loss_forward``);
2. AOTAutograd's joint forward-backward of that program (``joint_loss_index``): only the
   gradients that reach a parameter are computed (no gradient for inputs, integer ids or
   frozen weights, which are traced as buffers); then the core-ATen decompositions of the
   forward analysis, each decomposed node keeping the joint node it came from (a backward
   operator such as ``native_layer_norm_backward`` is one framework operator);
3. ``torch.export`` of ``optimizer.step()`` over the parameters and the optimizer's state
   held as buffers, in steady state (the state exists, as after step one: it is made by
   running the optimizer's own first step on meta twins of the parameters).

The joined graph reads the parameters, the optimizer state and the inputs, and writes the
loss, the updated parameters and the updated state; the gradients are intermediates. Each
node carries its phase (``PHASE_KEY``: forward, backward, optimizer), so that the counts
can be split by phase. Attention is traced with PyTorch's math SDPA so that its backward
is the four products of the saved probabilities (dV, dP, dQ, dK) with the mask a guard
in each, not a fused kernel that recomputes the scores.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import re
import time
import warnings
from collections import defaultdict

from .lower import GROUP_KEY, OPT_PREFIX, PHASE_KEY

DEFAULT_OPTIMIZER = "AdamW"


def _frontend_error(msg: str):
    from .capture import FrontendError
    return FrontendError(msg)


# --- the loss -----------------------------------------------------------------------


def loss_of(out):
    """The scalar loss a forward returned: the output itself when it is a one-element
    floating tensor, else its ``loss`` (a transformers ``ModelOutput`` given labels, a
    dict); ``None`` when there is none."""
    import torch
    if isinstance(out, torch.Tensor):
        return out if out.numel() == 1 and out.is_floating_point() else None
    cand = None
    if isinstance(out, dict) or hasattr(out, "keys"):
        try:
            cand = out["loss"] if "loss" in out.keys() else None
        except Exception:  # noqa: BLE001 - a mapping that does not index by key
            cand = None
    if cand is None:
        cand = getattr(out, "loss", None)
    if isinstance(cand, torch.Tensor) and cand.numel() == 1 and cand.is_floating_point():
        return cand.reshape(())
    return None


def _describe(out) -> str:
    import torch
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)} ({out.dtype})"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    keys = list(out.keys()) if hasattr(out, "keys") else []
    return f"a {type(out).__name__}" + (f" with {', '.join(map(str, keys[:6]))}" if keys else "")


@contextlib.contextmanager
def _loss_forward(model, source: str):
    """``model.forward`` returns its scalar loss while tracing; the original afterwards."""
    orig = model.forward
    found: dict = {}

    def forward(*args, **kwargs):
        out = orig(*args, **kwargs)
        loss = loss_of(out)
        if loss is None:
            found["missing"] = _describe(out)
            return out
        return loss

    try:
        # the inputs' placeholders are named after these parameters: prefixed, so that
        # none is named like an ATen op (an input ``t`` collides with AOTAutograd's
        # transpose nodes ``t_1``...: a KeyError inside the joint trace)
        sig = inspect.signature(orig)
        forward.__signature__ = sig.replace(parameters=[
            q.replace(name=f"input_{q.name}") for q in sig.parameters.values()])
    except (TypeError, ValueError):
        pass
    model.forward = forward
    try:
        yield found
    finally:
        del model.forward
    if found.get("missing"):
        raise _frontend_error(
            f"{source}: --train needs a forward that returns a scalar loss or an output with "
            f"a `loss` (a transformers model given labels); it returned {found['missing']}")


@contextlib.contextmanager
def _as_buffers(model, names: list[str]):
    """Parameters that take no gradient (frozen, or unused by the loss) traced as buffers:
    the joint then computes no gradient for them. Every module holding the same
    parameter (tied weights) gets the same buffer."""
    params = dict(model.named_parameters())
    held = [params[n] for n in names]
    ids = {id(p) for p in held}
    alias = {id(p): p.detach() for p in held}
    moved = []
    for _, mod in model.named_modules(remove_duplicate=False):
        for attr, p in list(mod._parameters.items()):
            if p is not None and id(p) in ids:
                del mod._parameters[attr]
                mod.register_buffer(attr, alias[id(p)])
                moved.append((mod, attr, p))
    try:
        yield
    finally:
        for mod, attr, p in moved:
            mod._buffers.pop(attr, None)
            mod._parameters[attr] = p


def _ancestors(graph, sig, kinds: tuple[str, ...]) -> set:
    """The nodes the graph's outputs of ``kinds`` (output-spec kind names) depend on,
    themselves included."""
    out = next(n for n in graph.nodes if n.op == "output")
    stack = [a for a, s in zip(out.args[0], sig.output_specs) if s.kind.name in kinds]
    seen: set = set()
    while stack:
        n = stack.pop()
        if n in seen or not hasattr(n, "all_input_nodes"):
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def _unused_parameters(ep, model) -> list[str]:
    """Parameters of an exported forward from which the loss (its user output) does not
    depend: no gradient reaches them."""
    sig = ep.graph_signature
    names = {n.name for n in _ancestors(ep.graph_module.graph, sig,
                                        ("USER_OUTPUT", "LOSS_OUTPUT"))
             if n.op == "placeholder"}
    from .reference import _resolve
    # tied parameters (GPT-2's input and output embeddings) are one tensor under two
    # names: unused only when no name of it reaches the loss
    reached = {id(_resolve(model, s.target)) for s in sig.input_specs
               if s.kind.name == "PARAMETER" and s.arg.name in names}
    return [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in reached]


def _drop_unused_aliases(ep, model):
    """A tied parameter appears once per name it has; a name the forward never reads
    (GPT-2's ``lm_head.weight`` when the embedding reads ``wte.weight``, or the other
    way round) is a placeholder AOTAutograd would find no gradient for: removed."""
    import torch
    from torch.export.graph_signature import ExportGraphSignature
    from .reference import _resolve
    sig = ep.graph_signature
    ph = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    used_ids = {id(_resolve(model, s.target)) for s in sig.input_specs
                if s.kind.name == "PARAMETER" and ph[s.arg.name].users}
    drop = [s for s in sig.input_specs if s.kind.name == "PARAMETER"
            and not ph[s.arg.name].users and id(_resolve(model, s.target)) in used_ids]
    if not drop:
        return ep
    gm = ep.graph_module
    for s in drop:
        gm.graph.erase_node(ph[s.arg.name])
    gm.recompile()
    new = ExportGraphSignature([s for s in sig.input_specs if s not in drop],
                               list(sig.output_specs))
    state = {k: v for k, v in ep.state_dict.items() if k not in {s.target for s in drop}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ep._update(gm, new, state_dict=state)


# --- the joint forward-backward ----------------------------------------------------


def _joint(ep):
    """AOTAutograd's joint graph of an exported forward (loss first), then core ATen."""
    from torch.export.exported_program import _decompose_exported_program
    from torch.export.experimental import _copy_graph_module_and_signature, _remove_detach_pass
    from .capture import _decomp_table, decompose_program
    if any(n.op == "call_function" and "autocast" in str(n.target) for n in ep.graph.nodes):
        # autocast regions (higher-order ops of the exported forward) applied first, as
        # the casts they make: AOTAutograd's joint trace of the region loses autocast
        # part way through (transformers' MLP after the attention came out fp32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = ep.run_decompositions({})
    j = _decompose_exported_program(ep, cia_to_decomp={}, python_decomp_table={},  # noqa
                                    joint_loss_index=0, decompose_custom_triton_ops=False)
    j = decompose_program(j, _decomp_table())
    gm, sig = _copy_graph_module_and_signature(j)
    _remove_detach_pass(gm, sig)
    return j._update(gm, sig)


@contextlib.contextmanager
def _traceable_nll():
    """While the step is traced, ``F.cross_entropy`` and ``F.nll_loss`` (no class weights,
    no label smoothing) are written out: log-softmax over the class dimension, the
    target's entry gathered, ignored targets multiplied by zero, the reduction. The same values as
    PyTorch's; on meta tensors AOTAutograd finds no gradient through
    ``aten.nll_loss_forward`` (every parameter would be reported as receiving none),
    while the gather's backward is traced like any other. Other arguments keep
    PyTorch's own functions."""
    import torch
    import torch.nn.functional as F
    orig_ce, orig_nll = F.cross_entropy, F.nll_loss

    def nll(logp, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
            reduction="mean"):
        if weight is not None or size_average is not None or reduce is not None \
                or target.is_floating_point() or logp.dim() < 2:
            return orig_nll(logp, target, weight, size_average, ignore_index, reduce,
                            reduction)
        keep = target != ignore_index
        picked = -logp.gather(1, torch.where(keep, target, 0).unsqueeze(1)).squeeze(1)
        picked = picked * keep.to(picked.dtype)    # (a where() with a number loses the
        # gradient on meta tensors too)
        if reduction == "none":
            return picked
        if reduction == "sum":
            return picked.sum()
        return picked.sum() / keep.sum()

    def ce(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
           reduction="mean", label_smoothing=0.0):
        if weight is not None or label_smoothing or size_average is not None \
                or reduce is not None or target.is_floating_point() or input.dim() < 2:
            return orig_ce(input, target, weight, size_average, ignore_index, reduce,
                           reduction, label_smoothing)
        return nll(torch.log_softmax(input, 1), target, ignore_index=ignore_index,
                   reduction=reduction)
    F.cross_entropy, F.nll_loss = ce, nll
    try:
        yield
    finally:
        F.cross_entropy, F.nll_loss = orig_ce, orig_nll


# --- the optimizer -----------------------------------------------------------------


def make_optimizer(model, problem_module=None, name: str | None = None):
    """The step's optimizer: ``make_optimizer(model)`` from the program's file when it
    defines one, else the ``torch.optim`` class ``name`` (default AdamW) with its defaults
    over the parameters that require a gradient."""
    import torch
    fn = getattr(problem_module, "make_optimizer", None) if problem_module is not None else None
    if fn is not None and name is None:
        opt = fn(model)
        if not isinstance(opt, torch.optim.Optimizer):
            raise _frontend_error(f"make_optimizer returned {type(opt).__name__}, not a "
                                  f"torch.optim.Optimizer")
        return opt
    name = name or DEFAULT_OPTIMIZER
    cls = getattr(torch.optim, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        known = sorted(n for n, c in vars(torch.optim).items()
                       if isinstance(c, type) and issubclass(c, torch.optim.Optimizer)
                       and c is not torch.optim.Optimizer)
        raise _frontend_error(f"--optimizer {name}: not a torch.optim optimizer (one of "
                              f"{', '.join(known)})")
    return cls([p for p in model.parameters() if p.requires_grad])


def _param_names(model) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def prime_state(opt, model, trained: list[str]) -> dict[str, dict]:
    """The optimizer's state after its first step, by the optimizer's own code, run on
    meta twins of the trained parameters (zero gradients): ``{param: {key: value}}``,
    tensors on the meta device (0-d step counters where the optimizer keeps them)."""
    import torch
    names = _param_names(model)
    params = dict(model.named_parameters())
    twin = {n: torch.empty_like(params[n], device="meta") for n in trained}
    probe = copy.copy(opt)
    probe.state = defaultdict(dict)
    probe.param_groups = []
    for g in opt.param_groups:
        ps = [twin[names[id(p)]] for p in g["params"] if names.get(id(p)) in twin]
        probe.param_groups.append({**g, "params": ps})
    for t in twin.values():
        t.grad = torch.zeros_like(t)
    try:
        with torch.no_grad():
            probe.step()
    except Exception as e:  # noqa: BLE001
        from ..loading import oneline
        raise _frontend_error(f"optimizer {type(opt).__name__}: its first step (run on meta "
                              f"tensors to make its state) failed: {oneline(e)}") from None
    return {n: dict(probe.state.get(t, {})) for n, t in twin.items()}


def _buffer_name(i: int, key: str = "") -> str:
    return f"p{i}" + (f"_{re.sub(r'[^0-9a-zA-Z_]', '_', key)}" if key else "")


# data parallelism (``--dp N``): the step's gradients are averaged over this many ranks by
# an all-reduce each before the optimizer uses them (DDP's semantics; its bucketing moves
# the same bytes), set by ``data_parallel``
_DP = {"ranks": 1}


@contextlib.contextmanager
def data_parallel(ranks: int):
    """Trace training steps as one rank of ``ranks`` data-parallel ones (a process group of
    that many ranks must be initialized: ``distributed.fake_world``)."""
    old = _DP["ranks"]
    _DP["ranks"] = ranks
    try:
        yield
    finally:
        _DP["ranks"] = old


def export_optimizer(opt, model, trained: list[str], state: dict[str, dict], source: str):
    """``opt.step()`` exported in steady state: a module holding the trained parameters
    and their state as buffers, taking the gradients; every update is a buffer
    mutation. Returns (ep, {buffer name: ("param", name) | ("state", name, key)})."""
    import torch
    import torch.nn as nn
    from .capture import _decomp_table, _quiet_torch_logs, decompose_program
    params = dict(model.named_parameters())
    names = _param_names(model)
    index = {n: i for i, n in enumerate(trained)}

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.where = {}
            self.keys = {}
            for n, i in index.items():
                p = params[n]
                self.register_buffer(_buffer_name(i), torch.empty_like(p, device=p.device))
                self.where[_buffer_name(i)] = ("param", n)
                tensors = {}
                for k, v in state[n].items():
                    if isinstance(v, torch.Tensor):
                        b = _buffer_name(i, "s_" + k)
                        # state lives with its parameter; 0-d counters where the
                        # optimizer keeps them (the CPU, unless capturable)
                        self.register_buffer(b, torch.empty_like(
                            v, device=v.device if v.dim() == 0 else p.device))
                        self.where[b] = ("state", n, k)
                        tensors[k] = b
                self.keys[n] = tensors

        def forward(self, *grads):
            if _DP["ranks"] > 1:
                import torch.distributed as dist
                import torch.distributed._functional_collectives as funcol
                grads = tuple(funcol.all_reduce(g, "avg", dist.group.WORLD) for g in grads)
            ps = {n: getattr(self, _buffer_name(i)) for n, i in index.items()}
            st = defaultdict(dict)
            for n, i in index.items():
                p = ps[n]
                p.grad = grads[i]
                st[p] = {k: (getattr(self, self.keys[n][k]) if k in self.keys[n] else v)
                         for k, v in state[n].items()}
            saved = (opt.param_groups, opt.state)
            opt.param_groups = [{**g, "params": [ps[names[id(p)]] for p in g["params"]
                                                 if names.get(id(p)) in ps]}
                                for g in opt.param_groups]
            opt.state = st
            try:
                opt.step()
            finally:
                opt.param_groups, opt.state = saved
                for p in ps.values():
                    p.grad = None
            return ()

    mod = Step()
    grads = tuple(torch.empty_like(params[n], device=params[n].device) for n in trained)
    try:
        with _quiet_torch_logs(), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.export(mod, grads, strict=False)
            ep = decompose_program(ep, _decomp_table())
    except Exception as e:  # noqa: BLE001
        from ..loading import oneline
        raise _frontend_error(f"{source}: optimizer {type(opt).__name__}: step() could not be "
                              f"traced: {oneline(e)}") from None
    return ep, mod.where


# --- joining -------------------------------------------------------------------------


def join(joint, opt_ep, where: dict, trained: list[str], opt_name: str,
         alias: dict[str, str] | None = None):
    """One ExportedProgram: the joint's forward and backward, then the optimizer reading
    its gradients. Outputs: the joint's buffer mutations, the loss, the updated
    parameters (parameter mutations) and the updated state (buffer mutations of
    ``optimizer.<param>.<key>``)."""
    import torch
    from torch.export.graph_signature import (ExportGraphSignature, InputKind, InputSpec,
                                              OutputKind, OutputSpec, TensorArgument)
    jsig, osig = joint.graph_signature, opt_ep.graph_signature
    jg, og = joint.graph_module.graph, opt_ep.graph_module.graph
    jout = next(n for n in jg.nodes if n.op == "output")
    alias = alias or {}     # a tied parameter's export name -> its named_parameters name
    grads = {alias.get(s.target, s.target): a for a, s in zip(jout.args[0], jsig.output_specs)
             if s.kind.name == "GRADIENT_TO_PARAMETER"}
    missing = [n for n in trained if n not in grads]
    if missing:
        raise _frontend_error(f"parameter {missing[0]} receives no gradient in the joint graph")
    jph = {n.name: n for n in jg.nodes if n.op == "placeholder"}
    param_ph = {alias.get(s.target, s.target): jph[s.arg.name] for s in jsig.input_specs
                if s.kind.name == "PARAMETER"}

    from torch._guards import detect_fake_mode
    mode = detect_fake_mode([n.meta.get("val") for n in jg.nodes if n.op == "placeholder"])
    g = torch.fx.Graph()
    env: dict = {}
    specs: list = []
    state_dict = dict(joint.state_dict)
    constants = dict(joint.constants)
    opt_ph = {n.name: n for n in og.nodes if n.op == "placeholder"}
    # placeholders: the joint's state, then the optimizer's, then the joint's user inputs
    for s in jsig.input_specs:
        if s.kind.name != "USER_INPUT":
            env[jph[s.arg.name]] = g.placeholder(s.arg.name)
            env[jph[s.arg.name]].meta = dict(jph[s.arg.name].meta)
            specs.append(s)
    ovals = {}
    for s in osig.input_specs:
        node = opt_ph[s.arg.name]
        if s.kind.name == "USER_INPUT":
            continue
        w = where.get(s.target)
        if w is not None and w[0] == "param":
            ovals[node] = ("param", w[1])
            continue
        target = f"{OPT_PREFIX}{w[1]}.{w[2]}" if w is not None else f"{OPT_PREFIX}{s.target}"
        name = re.sub(r"[^0-9a-zA-Z_]", "_", f"opt_{target}")
        ph = g.placeholder(name)
        ph.meta = dict(node.meta)
        _refake(ph, mode)
        ovals[node] = ph
        kind = s.kind if s.kind.name != "BUFFER" else InputKind.BUFFER
        specs.append(InputSpec(kind, TensorArgument(ph.name), target,
                               True if kind == InputKind.BUFFER else None))
        if s.kind.name == "BUFFER":
            state_dict[target] = opt_ep.state_dict[s.target]
        elif s.target in opt_ep.constants:
            constants[target] = opt_ep.constants[s.target]
    for s in jsig.input_specs:
        if s.kind.name == "USER_INPUT":
            env[jph[s.arg.name]] = g.placeholder(s.arg.name)
            env[jph[s.arg.name]].meta = dict(jph[s.arg.name].meta)
            specs.append(s)
    # the joint's nodes, each with its phase
    # the forward: what the loss or the forward's buffer updates depend on
    forward = _ancestors(jg, jsig, ("LOSS_OUTPUT", "USER_OUTPUT", "BUFFER_MUTATION"))
    for n in jg.nodes:
        if n.op in ("placeholder", "output"):
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
        env[n].meta[PHASE_KEY] = "forward" if n in forward else "backward"
    # the optimizer's, reading the gradients and the parameters
    grad_in = [opt_ph[s.arg.name] for s in osig.input_specs if s.kind.name == "USER_INPUT"]
    for node, pname in zip(grad_in, trained):
        ovals[node] = env[grads[pname]]
    for node, v in list(ovals.items()):
        if isinstance(v, tuple):
            ovals[node] = env[param_ph[v[1]]]
    for n in og.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            break
        ovals[n] = g.node_copy(n, lambda a: ovals[a])
        ovals[n].meta[PHASE_KEY] = "optimizer"
        _refake(ovals[n], mode)
        fn = n.meta.get("from_node") or []
        root = fn[0] if fn else None
        # (export keeps no frame of torch's own files: the optimizer's line is not known)
        ovals[n].meta[GROUP_KEY] = ("opt_" + (root.name if root is not None else n.name),
                                    str(root.target) if root is not None else str(n.target),
                                    f"torch.optim.{opt_name}.step")
    oout = next(n for n in og.nodes if n.op == "output")
    # export's order: mutations first, then user outputs
    muts, users = [], []          # (node, spec, kind override)
    for a, s in zip(jout.args[0], jsig.output_specs):
        if s.kind.name in ("GRADIENT_TO_PARAMETER", "GRADIENT_TO_USER_INPUT"):
            continue    # parameter gradients feed the optimizer; inputs take none
        if s.kind.name in ("LOSS_OUTPUT", "USER_OUTPUT"):
            users.append((env[a], OutputSpec(OutputKind.USER_OUTPUT,
                                             TensorArgument(env[a].name), None), None, "loss"))
        else:
            muts.append((env[a], OutputSpec(s.kind, TensorArgument(env[a].name), s.target),
                         None, None))
    for a, s in zip(oout.args[0], osig.output_specs):
        w = where[s.target]
        v = ovals[a]
        if w[0] == "param":
            users.append((v, OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(v.name), None),
                          ("parameter_mutation", w[1]), f"updated.{w[1]}"))
        else:
            muts.append((v, OutputSpec(OutputKind.BUFFER_MUTATION, TensorArgument(v.name),
                                       f"{OPT_PREFIX}{w[1]}.{w[2]}"), None, None))
    outs = [e[0] for e in muts + users]
    ospecs = [e[1] for e in muts + users]
    kinds = [e[2] for e in muts + users]
    paths = [e[3] for e in users]
    g.output(tuple(outs))
    gm = torch.fx.GraphModule(joint.graph_module, g)
    sig = ExportGraphSignature(specs, ospecs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = joint._update(gm, sig, state_dict=state_dict, constants=constants)
    # export's signature has no kind for a parameter update: the updated parameters are
    # user outputs there, and parameter mutations for the lowering
    ep.solbound_output_kinds = kinds
    ep.solbound_output_paths = paths
    ep.solbound_gradients = {p: env[grads[p]].name for p in trained}
    return ep


def _refake(node, mode) -> None:
    """A copied node's value in the joint's fake mode (an ExportedProgram has one): same
    shapes, strides, dtypes; a scalar read from a tensor (``.item()``) a fresh unbacked
    symbol there."""
    import torch
    from torch.utils._pytree import tree_map

    def conv(v):
        if isinstance(v, torch.Tensor):
            with mode:
                return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
        if isinstance(v, torch.SymFloat) and mode.shape_env is not None:
            return mode.shape_env.create_unbacked_symfloat()
        if isinstance(v, torch.SymInt) and mode.shape_env is not None:
            return mode.shape_env.create_unbacked_symint()
        return v
    if mode is None:
        return
    node.meta.pop("unbacked_bindings", None)
    if "val" in node.meta:
        node.meta["val"] = tree_map(conv, node.meta["val"])


# --- activation checkpointing ----------------------------------------------------------


@contextlib.contextmanager
def _checkpoint_calls(record: list):
    """Record every ``torch.utils.checkpoint`` region the forward runs (reentrant or not;
    transformers' gradient checkpointing included): its function and argument shapes.
    Tracing goes through the region once, so the joint graph holds no recomputation."""
    import torch
    import torch.utils.checkpoint as ck
    from torch.utils._pytree import tree_map

    def spec(v):
        if isinstance(v, torch.Tensor):
            return _TensorSpec(tuple(int(s) for s in v.shape), v.dtype)
        return v
    orig_gen, orig_cf = ck._checkpoint_without_reentrant_generator, ck.CheckpointFunction

    def shaped(fn):
        """A partial's bound tensors (transformers binds the mask and the rotary tables)
        as shapes too: the traced values do not outlive the trace."""
        if isinstance(fn, functools.partial):
            return ("partial", fn.func, tuple(tree_map(spec, list(fn.args))),
                    tree_map(spec, dict(fn.keywords)))
        return fn

    # the generator's leading options (preserve_rng_state, context_fn, ... early_stop in
    # torch 2.13): everything before *args
    n_opts = sum(1 for p in inspect.signature(orig_gen).parameters.values()
                 if p.kind == p.POSITIONAL_OR_KEYWORD) - 1

    def gen(fn, *rest, **kwargs):
        args = rest[n_opts:]
        record.append((shaped(fn), tree_map(spec, args), tree_map(spec, kwargs)))
        return orig_gen(fn, *rest, **kwargs)

    class Reentrant:
        @staticmethod
        def apply(fn, preserve, *args):
            record.append((shaped(fn), tree_map(spec, args), {}))
            return orig_cf.apply(fn, preserve, *args)
    ck._checkpoint_without_reentrant_generator, ck.CheckpointFunction = gen, Reentrant
    try:
        yield
    finally:
        ck._checkpoint_without_reentrant_generator, ck.CheckpointFunction = orig_gen, orig_cf


class _TensorSpec:
    """A tensor's shape and dtype (a pytree leaf: a tuple would be a container)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def __repr__(self) -> str:
        return f"T{self.shape}:{self.dtype}"


def _region_name(fn, model) -> str:
    import torch.nn as nn
    owner = None
    if isinstance(fn, tuple) and fn[0] == "partial":
        owner = next((a for a in fn[2] if isinstance(a, nn.Module)), None)
        fn = fn[1]
    owner = owner if owner is not None else getattr(fn, "__self__", None)
    if isinstance(owner, nn.Module):
        for name, mod in model.named_modules():
            if mod is owner:
                return name or type(owner).__name__
        return type(owner).__name__
    return getattr(fn, "__qualname__", repr(fn))


def recompute_costs(record: list, model, source: str) -> list[dict]:
    """The forward work of each checkpointed region (what its recomputation in the backward
    costs), counted by analyzing the region alone at the shapes it was called with:
    ``[{"region", "calls", "macs", "flops"}]``. Regions of the same function and shapes
    are analyzed once."""
    import torch
    import torch.nn as nn
    from torch._guards import detect_fake_mode
    from torch.utils._pytree import tree_leaves, tree_map
    from ...analysis.counts import count_program
    from ...graph.einsum import build_graph
    from .capture import export_program
    from .lower import lower
    params = list(model.parameters())
    mode = detect_fake_mode(params)
    device = params[0].device if params else torch.device("cpu")
    seen: dict = {}
    for fn, args, kwargs in record:
        key = (_region_name(fn, model), repr(args), repr(kwargs))
        if key in seen:
            seen[key]["calls"] += 1
            continue

        def make(v):
            if isinstance(v, _TensorSpec):
                if v.dtype.is_floating_point:
                    return torch.randn(v.shape, dtype=v.dtype, device=device)
                return torch.zeros(v.shape, dtype=v.dtype, device=device)
            return v
        with (mode if mode is not None else contextlib.nullcontext()):
            a, kw = tree_map(make, args), tree_map(make, kwargs)
            call = fn
            if isinstance(fn, tuple) and fn[0] == "partial":
                call = functools.partial(fn[1], *tree_map(make, list(fn[2])),
                                         **tree_map(make, fn[3]))
        owner = next((x for x in (call.args if isinstance(call, functools.partial) else ())
                      if isinstance(x, nn.Module)), getattr(call, "__self__", None))

        class Region(nn.Module):
            def __init__(self):
                super().__init__()
                if isinstance(owner, nn.Module):
                    self.inner = owner

            def forward(self, *xs):
                return call(*xs, **kw)
        # tensors the region receives besides its first input (a mask, rotary tables)
        # are known here by shape only: their values are data, so work a mask would skip
        # is counted (the cost is then an upper estimate, and says so)
        side = [v for v in tree_leaves((args[1:], kwargs,
                                        fn[3] if isinstance(fn, tuple) else {}))
                if isinstance(v, _TensorSpec)]
        entry = {"region": key[0], "calls": 1, "macs": None, "flops": None,
                 "masks_as_data": any(v.dtype == torch.bool for v in side)}
        try:
            with _traceable_nll():
                pc = count_program(build_graph(lower(export_program(
                    Region(), tuple(a), f"{source}: checkpointed {key[0]}")).program))
            entry.update(macs=pc.macs, flops=sum(pc.flops.values()))
        except Exception as e:  # noqa: BLE001 - stated, never counted as zero
            from ..loading import oneline
            entry["error"] = oneline(e)
        seen[key] = entry
    return list(seen.values())


# --- the whole step --------------------------------------------------------------------


@contextlib.contextmanager
def _math_attention():
    """SDPA as PyTorch's math composite: its backward differentiates the saved
    probabilities (four products) instead of recomputing them in a fused kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        yield


def export_train_step(model, inputs: tuple, source: str = "program", optimizer=None,
                      optimizer_name: str | None = None, problem_module=None,
                      keep_experts: bool = False, routing: str | None = None):
    """The training step of ``model`` on ``inputs`` as one ExportedProgram (module
    docstring). ``optimizer``: a torch.optim.Optimizer over the model's parameters (else
    ``make_optimizer(model)`` from ``problem_module``, else ``optimizer_name``)."""
    import torch
    from .capture import FrontendError, _quiet_torch_logs, export_program
    model.train()
    params = dict(model.named_parameters())
    frozen = [n for n, p in params.items() if not p.requires_grad]
    opt = optimizer if optimizer is not None else make_optimizer(model, problem_module,
                                                                 optimizer_name)
    notes = []
    with _math_attention(), _traceable_nll():
        regions: list = []
        with _loss_forward(model, source), _as_buffers(model, frozen), \
                _checkpoint_calls(regions):
            fwd = export_program(model, tuple(inputs), source, keep_experts=keep_experts,
                                 routing=routing, decompose=lambda ep: ep)
        unused = _unused_parameters(fwd, model)
        for n in unused:
            notes.append(f"parameter {n} receives no gradient (the loss does not depend on "
                         f"it): it is not updated, as torch.optim skips a parameter whose "
                         f".grad is None")
        if not [n for n in params if n not in frozen and n not in unused]:
            raise FrontendError(f"{source}: --train: no parameter requires a gradient that "
                                f"reaches the loss; nothing to train")
        with _loss_forward(model, source), _as_buffers(model, frozen + unused):
            if unused:
                fwd = export_program(model, tuple(inputs), source, keep_experts=keep_experts,
                                     routing=routing, decompose=lambda ep: ep)
            try:
                with warnings.catch_warnings(), _quiet_torch_logs():
                    warnings.simplefilter("ignore")
                    joint = _joint(_drop_unused_aliases(fwd, model))
            except Exception as e:  # noqa: BLE001
                from ..loading import oneline
                raise FrontendError(f"{source}: the backward of the loss could not be traced "
                                    f"(AOTAutograd): {oneline(e)}") from None
    trained = [n for n in params if n not in frozen and n not in unused]
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    not_in_opt = [n for n in trained if id(params[n]) not in in_opt]
    for n in not_in_opt:
        notes.append(f"parameter {n} receives a gradient but the optimizer does not update it "
                     f"(it is in no param group): its gradient is computed and dropped")
    stepped = [n for n in trained if n not in not_in_opt]
    recompute = recompute_costs(regions, model, source) if regions else []
    for r in recompute:
        what = (f"{r['flops']:,} FLOPs ({r['macs']:,} MACs) per call" if r["flops"] is not None
                else f"an amount that could not be counted ({r.get('error', '?')})")
        if r["flops"] is not None and r.get("masks_as_data"):
            what += (" at most (the mask it receives is known by shape only there: the work "
                     "it masks is included)")
        notes.append(f"checkpointed region {r['region']} ({r['calls']} call(s)): recomputing "
                     f"its forward in the backward costs {what}; the bound counts no "
                     f"recomputation (the step's own work does not need it)")
    state = prime_state(opt, model, stepped)
    opt_ep, where = export_optimizer(opt, model, stepped, state, source)
    from .reference import _resolve
    canonical = _param_names(model)
    alias = {s.target: canonical[id(_resolve(model, s.target))]
             for s in joint.graph_signature.input_specs
             if s.kind.name == "PARAMETER" and id(_resolve(model, s.target)) in canonical}
    ep = join(joint, opt_ep, where, stepped, type(opt).__name__, alias)
    ep.solbound_notes = list(getattr(fwd, "solbound_notes", [])) + notes
    ep.solbound_routing = getattr(fwd, "solbound_routing", None)
    ep.solbound_sizes_assumed = getattr(fwd, "solbound_sizes_assumed", False)
    ep.solbound_train = {"optimizer": type(opt).__name__, "trained": trained,
                         "recompute": recompute,
                         "stepped": stepped, "frozen": frozen, "unused": unused,
                         "defaults": {k: v for k, v in opt.defaults.items()
                                      if isinstance(v, (int, float, bool, str, tuple))}}
    return ep


# --- validation ------------------------------------------------------------------------


def _state_of(target: str) -> tuple[str, str]:
    """``optimizer.<parameter>.<key>`` (an optimizer state buffer's target) -> (parameter,
    key)."""
    pname, _, key = target[len(OPT_PREFIX):].rpartition(".")
    return pname, key


def _real_optimizer(model, rep_train: dict):
    """The step's optimizer over a real copy of the model (as the analysis chose it)."""
    opt = rep_train.get("optimizer")
    mod = rep_train.get("problem_module")
    if opt is not None and not isinstance(opt, str):
        # an instance over the analyzed model: the same class and hyperparameters
        groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        if len(groups) == 1:
            return type(opt)([p for p in model.parameters() if p.requires_grad], **groups[0])
        return type(opt)(model.parameters(), **opt.defaults)
    return make_optimizer(model, mod, opt)


def validate_step(rep, model=None, inputs=None, *, problem=None, seed: int = 0,
                  max_bytes: int | None = None, max_seconds: float | None = None) -> dict:
    """The IR of the training step against PyTorch's own step on real inputs.

    A real copy of the model and its optimizer first take one real step (so that the
    optimizer's state exists, as the analysis assumed); the step is traced again on
    them, and the IR is run from their parameters and state. The reference is eager
    PyTorch: ``loss = model(*inputs)``, ``loss.backward()``, ``optimizer.step()``.
    Compared: the loss, every parameter's gradient, the updated parameters and the
    updated optimizer state (and buffers the forward updates). A program that draws
    random numbers (dropout) is compared against its traced step graph with the draws
    replayed into the IR instead."""
    import torch
    from ...validate.compare import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, EPS, _InputScale,
                                     _strided, compare, estimate_cost, max_reduction,
                                     operator_calls, rel_error, tolerance, tolerance_rule)
    from ...ir.execute import ExecutionError, execute
    from .capture import FrontendError
    from .reference import (HarnessError, _build_real, _feeds, _is_abstract, _on_meta,
                            _real_value, _to_np, first_divergence, made_once, replay_draws)
    t0 = time.perf_counter()
    if rep.unsupported:
        # an operator the IR does not compute cannot be run: not a failure of the IR
        names = sorted({u.operator for u in rep.unsupported})
        return {"status": "skipped", "seconds": 0.0,
                "reason": f"unsupported operators ({', '.join(names)}): the IR does not compute "
                          f"the whole step, so there is nothing whole to compare"}
    max_bytes = max_bytes or DEFAULT_MAX_BYTES
    max_seconds = max_seconds or DEFAULT_MAX_SECONDS
    info = getattr(rep, "train", None) or {}
    mem, secs = estimate_cost(rep.program, sum(rep.counts.flops.values()))
    reduced = None
    if mem > max_bytes or secs > max_seconds:
        # a smaller instance of the file (its size constants scaled down) whose step keeps
        # the kernel structure and fits the budget
        found = _reduced_step(rep, problem, max_bytes, max_seconds)
        if found is None:
            return {"status": "skipped",
                    "reason": f"over budget (~{mem / 2**30:.1f} GiB, ~{secs:.0f} s) and no "
                              f"reduced instance (smaller size constants of the file) keeps "
                              f"the step's kernel structure within it"}
        reduced, problem = found
    if problem is not None:
        model, inputs = _build_real(problem, seed)
    elif model is None or _on_meta(model, inputs):
        return {"status": "skipped", "reason": "the module or its inputs live on the meta "
                                               "device: no real values to run"}
    else:
        model = copy.deepcopy(model)
    inputs = tuple(inputs)
    torch.manual_seed(seed)
    model.train()
    from .capture import _flex_device_check_lifted
    try:
        opt = _real_optimizer(model, info)
        # step one, for real: the optimizer's state exists afterwards
        with _flex_device_check_lifted(cpu_backward=True):
            loss = loss_of(model(*inputs))
            if loss is None:
                raise HarnessError("the forward returned no scalar loss on real inputs")
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    except HarnessError as e:
        return {"status": "skipped", "reason": f"the reference could not run: {e}"}
    except Exception as e:  # noqa: BLE001 - the reference failed, not the IR
        from ..loading import oneline
        return {"status": "skipped",
                "reason": f"running the training step on real inputs failed: {oneline(e)}"}
    from .stacks import export_and_lower_step

    def traced():
        return export_and_lower_step(model, inputs, rep.source,
                                     reroll_layers=getattr(rep, "reroll", True), optimizer=opt,
                                     keep_experts=getattr(rep, "keep_experts_dispatch", False),
                                     routing=getattr(rep, "routing", None))
    if reduced is None and getattr(rep, "exported", None) is not None:
        # one program, one verdict: the analyzed step runs on the real model's values; a
        # constant it holds without values comes from the real step's own export
        ep, low = rep.exported, rep.lowered
        ep.solbound_real_export = made_once(lambda: traced()[0], "exporting the real step "
                                                                 "for the values of its constants")
    else:
        try:
            ep, low = traced()     # the reduced instance, whose structure was checked
        except FrontendError as e:
            return {"status": "skipped", "reason": f"re-tracing the reduced step failed: {e}"}
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    def state_value(target: str):
        if target.startswith(OPT_PREFIX):
            pname, key = _state_of(target)
            return opt.state[params[pname]][key]
        if target in params:
            return params[target]
        if target in buffers:
            return buffers[target]
        if target in ep.constants:
            val = ep.constants[target]
            return _real_value(ep, target, val) if _is_abstract(val) else val
        from .reference import _resolve
        return _resolve(model, target)       # a tied parameter under its other name
    feeds = _feeds(low, inputs, state_value)
    # the graph's own arguments (for the diagnosis and for replaying draws)
    user = iter(inputs)
    args = [next(user) if sp.kind.name == "USER_INPUT" else state_value(sp.target).detach()
            for sp in ep.graph_signature.input_specs]
    recorded: dict = {}
    draws = {}
    if low.random_draws:
        outs, draws, recorded = replay_draws(
            ep, low, [a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        golden = [_to_np(v) for v in outs]
        grads_ref = {}
        reference = "the traced step graph, its random draws replayed into the IR"
    else:
        ref_model, ref_opt = copy.deepcopy((model, opt))
        ref_params = dict(ref_model.named_parameters())
        ref_buffers = dict(ref_model.named_buffers())
        try:
            with _flex_device_check_lifted(cpu_backward=True):
                loss = loss_of(ref_model(*inputs))
                loss.backward()
            grads_ref = {n: _to_np(p.grad) for n, p in ref_params.items() if p.grad is not None}
            ref_opt.step()
        except Exception as e:  # noqa: BLE001
            from ..loading import oneline
            return {"status": "skipped",
                    "reason": f"the reference step failed on real inputs: {oneline(e)}"}
        golden = []
        for o in low.outputs:
            if o["kind"] == "output":
                golden.append(_to_np(loss.detach()))
            elif o["kind"] == "parameter_mutation":
                golden.append(_to_np(ref_params[o["target"]]))
            elif o["kind"] == "buffer_mutation" and o["target"].startswith(OPT_PREFIX):
                pname, key = _state_of(o["target"])
                golden.append(_to_np(ref_opt.state[ref_params[pname]][key]))
            elif o["kind"] == "buffer_mutation":
                golden.append(_to_np(ref_buffers[o["target"]]))
            else:
                golden.append(None)
        reference = "PyTorch's own step: forward, loss.backward(), optimizer.step()"
    p = low.program
    # the step's precision is its lowest: autocast's bf16 products feed fp32 gradients,
    # and the optimizer's normalized update carries their rounding into the parameters
    dtypes = [t.dtype for t in p.tensors if t.dtype in EPS]
    src_dtype = max(dtypes, key=lambda d: EPS.get(d, 0.0)) if dtypes else "f32"
    tol = tolerance(src_dtype, max_reduction(p), operator_calls(p))

    def on_kernel(k, arrays):
        if k.out in draws:
            arrays[k.out][...] = draws[k.out].reshape(arrays[k.out].shape)
    try:
        arrays = execute(p, feeds, on_kernel=on_kernel)
    except ExecutionError as e:
        return {"status": "failed", "reason": f"IR execution error: {e}", "tolerance": tol,
                "seconds": time.perf_counter() - t0}
    scale = _InputScale(p, arrays)
    outs = compare(low, arrays, golden, tol, scale)
    for o in outs:
        if o["kind"] == "output":
            o["output"] = "loss"
    rows = (low.training or {}).get("gradient_rows")
    for pname, ref in grads_ref.items():
        if rows is not None:          # a rerolled step: the row of a stacked gradient
            if pname not in rows:
                continue
            ir, row = rows[pname]
            mine = arrays[ir] if row is None else arrays[ir][row]
            err = rel_error(mine.reshape(ref.shape), ref, scale(ir))
        else:
            node = getattr(ep, "solbound_gradients", {}).get(pname)
            info_v = low.values.get(node) if node else None
            if info_v is None:
                continue
            mine = _strided(arrays[info_v["ir"]], info_v["shape"], info_v["strides"],
                            info_v["offset"])
            err = rel_error(mine, ref, scale(info_v["ir"]))
        outs.append({"output": f"grad.{pname}", "kind": "gradient", "shape": list(ref.shape),
                     "worst_rel_error": err if math.isfinite(err) else None,
                     "ok": bool(err <= tol)})
    trained = set((low.training or {}).get("trained") or ep.solbound_train["trained"])
    missing = sorted(n for n in trained - {o["output"][5:] for o in outs
                                            if o["kind"] == "gradient"}
                     if n in grads_ref) if grads_ref else []
    ok = all(o["ok"] for o in outs) and not missing
    res = {"status": "passed" if ok else "failed", "tolerance": tol,
           "tolerance_rule": tolerance_rule(src_dtype),
           "outputs": outs, "reference": reference,
           "compared": {"loss": 1, "gradients": sum(o["kind"] == "gradient" for o in outs),
                        "parameters": sum(o["kind"] == "parameter_mutation" for o in outs),
                        "optimizer_state": sum(o["kind"] == "buffer_mutation"
                                               and str(o["output"]).startswith(OPT_PREFIX)
                                               for o in outs)}}
    if missing:
        res["reason"] = f"no IR gradient found for {missing[0]}"
    # what the reference computed that no IR output was matched to (stated, not dropped)
    seen = {o["output"] for o in outs}
    res["not_compared"] = sorted(
        [f"grad.{n}" for n in grads_ref if f"grad.{n}" not in seen]
        + [n for n in trained if n not in seen and grads_ref])
    if not ok:
        fd = first_divergence(ep, low, None, None, arrays, tol, recorded or None, scale,
                              args=[a.clone() if isinstance(a, torch.Tensor) else a
                                    for a in args])
        res["first_divergence"] = fd
    worst = max((math.inf if o["worst_rel_error"] is None else o["worst_rel_error"]
                 for o in outs), default=0.0)
    c = res["compared"]
    res["summary"] = (f"loss, {c['gradients']} gradients, {c['parameters']} updated parameters "
                      f"and {c['optimizer_state']} optimizer state tensors: worst relative error "
                      f"{worst:.3g} (tolerance {tol:.3g})")
    if reduced is not None:
        res["reduced"], res["reduced_by"] = True, reduced
        res["summary"] += f" at reduced shapes ({reduced})"
    res["seconds"] = time.perf_counter() - t0
    return res


def _reduced_step(rep, problem, max_bytes: int, max_seconds: float):
    """(description, smaller problem) whose training step has the analyzed step's kernel
    structure and fits the validation budget; None when the file offers none."""
    from ...validate.compare import fits_budget
    from .lower import lower
    info = getattr(rep, "train", None) or {}
    if problem is None or not hasattr(problem, "shrink"):
        return None
    name = info.get("optimizer") if isinstance(info.get("optimizer"), str) else None
    for desc, small in problem.shrink():
        try:
            m, inp, _ = small.build_for_capture()
            low = lower(export_train_step(m, tuple(inp), rep.source, optimizer_name=name,
                                          problem_module=info.get("problem_module")))
        except Exception:  # noqa: BLE001 - a size the program does not accept
            continue
        if fits_budget(low.program, rep.program, max_bytes, max_seconds):
            return desc, small
    return None
