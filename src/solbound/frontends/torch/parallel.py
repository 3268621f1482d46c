"""Tensor parallelism from the model's own plan: transformers' integration, traced per rank.

``tensor_parallel(model, n)`` shards a transformers model the way
``from_pretrained(..., tp_plan="auto")`` does: ``DistributedConfig(tp_size=n)``, the
model's ``base_model_tp_plan`` resolved and expanded by the model itself
(``_resolve_parallel_plans``), and transformers' ``maybe_distribute_model`` applying its
styles on a device mesh of the fake process group (``distributed.fake_world``). The plan
and the linear layers' styles are transformers' own: a column-wise linear keeps ``1/n`` of
its output features, a row-wise one ``1/n`` of its input features followed by
``dist.all_reduce`` (transformers' inference path on local shards).

Two styles compute through DTensor redistributions that ``torch.export`` cannot trace
yet (a fake tensor among the exported constants, a data-dependent ``aten.equal`` in the
vocabulary-parallel embedding's sharding rule). While the model is sharded they are
replaced by the same placements computed on local shards, with explicit collectives:

* ``embedding_rowwise`` (vocabulary-parallel embedding, Megatron's ``VocabParallelEmbedding``):
  rank ``r`` holds rows ``[r*c, (r+1)*c)`` (``c = ceil(V/n)``, DTensor's ``Shard(0)``),
  looks up the ids in its range, zeroes the others, and the ranks' lookups are summed by an
  all-reduce;
* ``colwise_gather_output`` (the LM head): the local ``V/n`` columns of the logits, then an
  all-gather along the last dimension.

The sharded model is a per-rank program (rank 0), with its collectives.

``expert_parallel(model, n)`` shards a transformers mixture of experts by its own
expert-parallel plan (``base_model_ep_plan``, resolved by ``_resolve_parallel_plans``)
with transformers' ``apply_expert_parallelism`` and its ``AllToAllEP`` dispatch: rank
``r`` holds experts ``[r*E/n, (r+1)*E/n)`` whole, attention and every other layer
replicated, and its own batch (data-parallel attention, the layout of expert-parallel
serving). Each MoE layer sends each (token, expert) pair to the expert's rank with an
all-to-all (after one of the per-expert counts) and gets the results back with a second.
The split sizes are read from those counts; they are traced under the routing assumption
(``routing.py``: every rank routes its batch as this rank does, so the splits are equal).
"""

from __future__ import annotations

import contextlib


class ParallelError(ValueError):
    pass


def _local_styles():
    """Traceable versions of the two DTensor-only styles (see the module doc)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from transformers.distributed.tensor_parallel import ColwiseParallel
    from torch.distributed.tensor import Replicate
    try:
        from transformers.distributed.tensor_parallel import EmbeddingParallel
    except ImportError:                                  # pragma: no cover - older transformers
        from transformers.integrations.tensor_parallel import EmbeddingParallel

    def group(mesh):
        return mesh.get_group() if mesh.ndim == 1 else mesh.get_group("tp")

    class LocalVocabEmbedding(EmbeddingParallel):
        def should_use_local_tensors(self, module):
            return True

        def transform_inputs_pre_forward(self, module, args, kwargs, mesh, **_):
            ids = args[0]
            n, r = mesh.size(), mesh.get_local_rank()
            rows = -(-module.num_embeddings // n)
            lo, hi = r * rows, min(module.num_embeddings, (r + 1) * rows)
            outside = (ids < lo) | (ids >= hi)
            module._solbound_outside = outside
            return (torch.where(outside, 0, ids - lo),) + tuple(args[1:]), kwargs

        def transform_output_post_forward(self, module, output, mesh, **_):
            outside = module.__dict__.pop("_solbound_outside")
            output = torch.where(outside.unsqueeze(-1), 0, output)
            dist.all_reduce(output, group=group(mesh))
            return output

    class LocalGatherColwise(ColwiseParallel):
        def should_use_local_tensors(self, module):
            return True

        def transform_inputs_pre_forward(self, module, args, kwargs, mesh, **_):
            return args, kwargs

        def transform_output_post_forward(self, module, output, mesh, **_):
            # (``**_``: transformers >= 5.25 passes the model's config)
            return funcol.all_gather_tensor(output.contiguous(), gather_dim=output.dim() - 1,
                                            group=group(mesh))

    return {"embedding_rowwise": LocalVocabEmbedding(shard_dim=0),
            "colwise_gather_output": LocalGatherColwise(input_layouts=Replicate(),
                                                        output_layouts=Replicate()),
            "colwise_rep": LocalGatherColwise(input_layouts=Replicate(),
                                              output_layouts=Replicate())}


@contextlib.contextmanager
def _traceable_styles():
    """transformers' style registry with the local styles in place of the DTensor-only
    ones, for the duration (the originals are put back)."""
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES
    styles = _local_styles()
    saved = {name: ALL_PARALLEL_STYLES[name] if name in ALL_PARALLEL_STYLES else None
             for name in styles}
    for name, style in styles.items():
        ALL_PARALLEL_STYLES.register(name, style)
    try:
        yield
    finally:
        for name, style in saved.items():
            if style is not None:
                ALL_PARALLEL_STYLES.register(name, style)


def tensor_parallel(model, n: int):
    """``model`` (a transformers ``PreTrainedModel``, any device) sharded ``n`` ways by its
    own tensor-parallel plan, as rank 0 sees it; needs ``fake_world(n)`` (or any process
    group of ``n`` ranks) around it and around the trace. A module that wraps a transformers
    model (a decode step building its cache) has that model sharded in place."""
    if n == 1:
        return model
    inner = _transformers_model(model)
    if inner is not None and inner is not model:
        _shard(inner, n)
        model.solbound_tp = n
        return model
    return _shard(model, n)


def _transformers_model(model):
    """``model`` itself when it is a transformers model, else the one transformers model
    it wraps (a decode step building its cache), else None."""
    if hasattr(type(model), "maybe_distribute_model"):
        return model
    outer: dict[str, object] = {}      # outermost transformers models (pre-order walk)
    for name, m in model.named_modules():
        if hasattr(type(m), "maybe_distribute_model") and \
                not any(name.startswith(o + ".") for o in outer):
            outer[name] = m
    return next(iter(outer.values())) if len(outer) == 1 else None


def _shard(model, n: int):
    import torch.distributed as dist
    if not (dist.is_initialized() and dist.get_world_size() == n):
        raise ParallelError(f"--tp {n}: needs a process group of {n} ranks (fake_world({n}))")
    try:
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.utils import initialize_distributed_mesh
    except ImportError as e:
        raise ParallelError(f"--tp needs transformers' distributed integration "
                            f"(transformers >= 5): {e}") from None
    if not hasattr(type(model), "maybe_distribute_model"):
        raise ParallelError(f"--tp {n}: {type(model).__name__} is not a transformers model "
                            f"(shard a model of your own per rank with torch.distributed and "
                            f"use --world-size)")
    config = getattr(model, "config", None)
    plan = getattr(model, "tp_plan", None) or {}
    if not plan:
        raise ParallelError(f"--tp {n}: {type(model).__name__} has no tensor-parallel plan "
                            f"(its config has no base_model_tp_plan)")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, attr, None)
        if isinstance(heads, int) and heads % n:
            raise ParallelError(f"--tp {n}: {type(model).__name__}'s {attr} = {heads} does "
                                f"not split over {n} ranks")
    dc = DistributedConfig(tp_size=n)
    _, mesh = initialize_distributed_mesh(dc)
    with _traceable_styles():
        model = type(model).maybe_distribute_model(model, dc, mesh)
    model.solbound_tp = n
    return model


def fully_shard(model, n: int):
    """``model`` as one rank of ``n`` fully sharded data-parallel ones (FSDP, ZeRO-3): each
    parameter holds rank 0's rows ``[0, c)`` of its first dimension (``c = ceil(d0 / n)``,
    FSDP2's padded ``Shard(0)``), and every use all-gathers it (a parametrization over
    ``all_gather_tensor_autograd``, whose backward is the gradient's reduce-scatter). The
    optimizer then steps the shards: ``1/n`` of its work and state per rank.

    Each parameter is gathered once per step and kept for the backward pass (FSDP's
    ``reshard_after_forward=False``, ZeRO-2's traffic); FSDP2's default frees it after the
    forward and gathers it again for the backward, one more all-gather of every parameter,
    which this bound does not charge (it stays a lower bound). Needs a process group of
    ``n`` ranks (``fake_world(n)``)."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.nn as nn
    import torch.nn.utils.parametrize as parametrize
    if n == 1:
        return model
    if not (dist.is_initialized() and dist.get_world_size() == n):
        raise ParallelError(f"--fsdp {n}: needs a process group of {n} ranks")

    class Gathered(nn.Module):
        """The whole parameter from every rank's rows (FSDP's all-gather)."""

        def __init__(self, rows: int):
            super().__init__()
            self.rows = rows

        def forward(self, shard):
            full = funcol.all_gather_tensor_autograd(shard, 0, dist.group.WORLD)
            return full if full.shape[0] == self.rows else full[: self.rows]

    for module in list(model.modules()):
        for name, p in list(module.named_parameters(recurse=False)):
            if p is None or p.dim() == 0 or not p.requires_grad:
                continue
            rows = p.shape[0]
            c = -(-rows // n)
            with torch.no_grad():
                shard = p.detach()[:c].clone()
                if shard.shape[0] < c:              # fewer rows than ranks: padded
                    shard = torch.cat([shard, shard.new_zeros((c - shard.shape[0],)
                                                              + tuple(shard.shape[1:]))])
            setattr(module, name, nn.Parameter(shard))
            parametrize.register_parametrization(module, name, Gathered(rows), unsafe=True)
    model.solbound_fsdp = n
    return model


def expert_parallel(model, n: int):
    """``model`` (a transformers mixture of experts, or a module wrapping one) sharded ``n``
    ways by its own expert-parallel plan, as rank 0 sees it (see the module doc); needs a
    process group of ``n`` ranks around it and around the trace."""
    if n == 1:
        return model
    target = _transformers_model(model)
    if target is None:
        raise ParallelError(f"--ep {n}: {type(model).__name__} is not a transformers model "
                            f"(write expert parallelism per rank with torch.distributed and "
                            f"use --world-size)")
    import torch
    import torch.distributed as dist
    if not (dist.is_initialized() and dist.get_world_size() == n):
        raise ParallelError(f"--ep {n}: needs a process group of {n} ranks")
    try:
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.expert_parallel import apply_expert_parallelism
    except ImportError as e:
        raise ParallelError(f"--ep needs transformers' expert-parallel integration "
                            f"(transformers >= 5.20): {e}") from None
    dc = DistributedConfig(ep_size=n, fsdp_size=n, ep_implementation="all_to_all")
    try:
        _, plan, _ = target._resolve_parallel_plans(dc)
    except Exception as e:  # noqa: BLE001 - transformers' own message, in one line
        raise ParallelError(f"--ep {n}: {type(target).__name__}: {e}") from None
    if not plan or "ep_dispatch_experts" not in plan.values():
        raise ParallelError(f"--ep {n}: {type(target).__name__} has no expert-parallel plan "
                            f"(its config has no base_model_ep_plan with an "
                            f"ep_dispatch_experts rule)")
    mesh = torch.distributed.init_device_mesh("cpu", (n, 1), mesh_dim_names=("ep", "tp"))
    try:
        apply_expert_parallelism(target, mesh["ep"], mesh["tp"], plan,
                                 ep_implementation="all_to_all")
    except ValueError as e:              # "Cannot evenly shard 6 experts across 4 ranks"
        raise ParallelError(f"--ep {n}: {type(target).__name__}: {e}") from None
    model.solbound_ep = n
    return model
