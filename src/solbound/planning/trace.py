"""Profiles of a transformers causal LM's training step, one per TP degree and microbatch
size, traced once each (and kept on disk: ``$SOLBOUND_CACHE``, default
``~/.cache/solbound``).

A rank of Megatron-style tensor parallelism over ``t`` ranks runs the model with
``1 / t`` of the attention heads (query and key-value), of the MLP's intermediate width and
of the vocabulary (the vocabulary-parallel embedding and head, padded up), the hidden
width whole: that is the model this module builds from the config (``shard_config``), so
the rank's work and state are the traced program's. The collectives that join the ranks
are added by the search (``planning.search``). Not modelled in the rank's program: the
vocabulary-parallel embedding's mask of the tokens other ranks hold and the cross-entropy's
all-reduced max and sum (a few operations a token); sequence parallelism.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle

from .profile import Profile, profile_of
from .search import PlanError


def shard_config(cfg, tp: int):
    """A copy of the transformers ``cfg`` with a tensor-parallel rank's share (module
    doc). :class:`PlanError` when the heads do not split over ``tp``."""
    import copy
    c = copy.deepcopy(cfg)
    if tp == 1:
        return c
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    if heads % tp:
        raise PlanError(f"tp {tp}: {heads} attention heads do not split over {tp} ranks")
    if kv % tp and tp % kv:
        raise PlanError(f"tp {tp}: {kv} key-value heads neither split over nor replicate "
                        f"onto {tp} ranks")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    c.head_dim = head_dim
    c.num_attention_heads = heads // tp
    c.num_key_value_heads = max(1, kv // tp)
    if getattr(cfg, "intermediate_size", None):
        if cfg.intermediate_size % tp:
            raise PlanError(f"tp {tp}: an intermediate width of {cfg.intermediate_size} "
                            f"does not split over {tp} ranks")
        c.intermediate_size = cfg.intermediate_size // tp
    c.vocab_size = -(-cfg.vocab_size // tp)
    return c


def _loss_model(cfg, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    class Step(torch.nn.Module):
        """The model's loss on its own tokens as labels (a causal LM's training step)."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, labels=ids, use_cache=False).loss
    dt = getattr(torch, dtype)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dt, attn_implementation="sdpa")
    return Step(m.to(dt).train())


def _code_hash() -> str:
    """A digest of solbound's own sources: a profile traced by other code is traced again."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(d, f), "rb") as fh:
                    h.update(f.encode() + fh.read())
    return h.hexdigest()


def _cache_dir() -> str:
    return os.environ.get("SOLBOUND_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "solbound")


def _path(sharded, tp: int, microbatch: int, seq: int, dtype: str) -> str:
    text = json.dumps({"cfg": sharded.to_dict(), "tp": tp, "mbs": microbatch, "seq": seq,
                       "dtype": dtype, "code": _code_hash()}, sort_keys=True, default=str)
    return os.path.join(_cache_dir(), "profiles",
                        hashlib.sha256(text.encode()).hexdigest()[:24] + ".pkl")


def _read(path: str) -> Profile | None:
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - absent, stale or broken: traced again
        return None


def kv_bytes(sharded, microbatch: int, seq: int, itemsize: int) -> int:
    """One layer's keys and values of a microbatch, every token, at a rank's heads (what
    context parallelism gathers)."""
    heads = sharded.num_attention_heads
    kv = getattr(sharded, "num_key_value_heads", None) or heads
    hd = getattr(sharded, "head_dim", None) or sharded.hidden_size // heads
    return 2 * kv * hd * seq * microbatch * itemsize


def profile(cfg, tp: int, microbatch: int, seq: int, dtype: str = "bfloat16",
            arch: str = "h100-sxm", cache: bool = True) -> Profile:
    """The :class:`Profile` of ``cfg``'s training step at TP ``tp`` (``microbatch``
    sequences of ``seq`` tokens), from disk when traced before by the same code."""
    import torch

    from ..api import analyze
    sharded = shard_config(cfg, tp)
    path = _path(sharded, tp, microbatch, seq, dtype)
    if cache and (hit := _read(path)) is not None:
        return hit
    model = _loss_model(sharded, dtype)
    ids = torch.zeros(microbatch, seq, dtype=torch.long, device="meta")
    rep = analyze(model, (ids,), arch=arch, train=True, modes=("fused",))
    if rep.unsupported:
        raise PlanError(f"tp {tp}: the step has unsupported operators "
                        f"({', '.join(sorted({u.operator for u in rep.unsupported}))})")
    prof = profile_of(rep, tp, microbatch, seq, cfg.hidden_size)
    prof.hidden = cfg.hidden_size
    prof.act_itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    prof.kv_bytes = kv_bytes(sharded, microbatch, seq, prof.act_itemsize)
    prof.heads = sharded.num_attention_heads
    prof.kv_heads = getattr(sharded, "num_key_value_heads", None) or prof.heads
    prof.q_bytes = prof.kv_bytes * prof.heads / (2 * prof.kv_heads)
    if cache:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + f".{os.getpid()}.tmp", "wb") as f:
            pickle.dump(prof, f)
        os.replace(path + f".{os.getpid()}.tmp", path)
    return prof


def profiles(cfg, keys: list[tuple[int, int]], seq: int, dtype: str = "bfloat16",
             arch: str = "h100-sxm", jobs: int | None = None, progress=None) -> dict:
    """``(tp, microbatch) -> Profile`` for each key: read from disk, the rest traced in
    ``jobs`` processes (default: the CPUs, at most 2 here: each trace is one core's)."""
    out, todo = {}, []
    for tp, mbs in keys:
        hit = _read(_path(shard_config(cfg, tp), tp, mbs, seq, dtype))
        if hit is not None:
            out[(tp, mbs)] = hit
        else:
            todo.append((tp, mbs))
    jobs = min(jobs or os.cpu_count() or 1, len(todo))
    if progress:
        progress(len(out), todo)
    if jobs <= 1:
        for tp, mbs in todo:
            out[(tp, mbs)] = profile(cfg, tp, mbs, seq, dtype, arch)
        return out
    import concurrent.futures as cf
    import multiprocessing as mp
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(profile, cfg, tp, mbs, seq, dtype, arch): (tp, mbs)
                for tp, mbs in todo}
        for f in cf.as_completed(futs):
            out[futs[f]] = f.result()
    return out
