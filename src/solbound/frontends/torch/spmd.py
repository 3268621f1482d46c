"""Validation of a per-rank program: every rank run at once, collectives for real.

The analyzed program is rank 0's, traced under a fake process group. To check it, each of
the ``n`` ranks builds its own model and inputs (seed ``seed + rank``: its own shard
values and data; under ``--tp`` and ``--ep`` every rank builds the same full model and
inputs, so the shards are slices of one model and the inputs replicated), one thread per rank under PyTorch's threaded process group
(``torch.testing._internal.distributed.multi_threaded_pg``: real collectives between
threads of one process). Each rank traces and lowers its own program (a rank's program can
differ from rank 0's: a vocabulary-parallel embedding offsets the ids it looks up by its
rank), then all ranks run their models at once: the reference, with real all-reduces and
all-gathers. The IR runs the same way (``ir.execute.execute_spmd``: every rank's program in
lockstep, each collective computed from every rank's operand), and every rank's outputs are
compared with its reference. Rank 0's re-traced program must have the analyzed program's
kernel structure; rank 0 then runs the analyzed IR itself, fed by name with the values its
own trace bound (one program, one verdict), and the other ranks their own programs.
"""

from __future__ import annotations

import threading
import time


def validate_spmd(rep, problem, world: int, tp: int = 1, seed: int = 0, ep: int = 1,
                  max_bytes: int | None = None, max_seconds: float | None = None) -> dict:
    from ...validate.compare import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, _InputScale,
                                     _structure, compare, estimate_cost, max_reduction,
                                     operator_calls, tolerance_dtype, per_rank_result,
                                     tolerance, tolerance_rule)
    t0 = time.perf_counter()
    if problem is None:
        return {"status": "skipped", "reason": "a per-rank program is validated from a file or "
                                               "factory (each rank builds its own model)"}
    if rep.lowered.unsupported:
        return {"status": "skipped", "reason": "unsupported operators: the IR does not compute "
                                               "the whole program"}
    mem, secs = estimate_cost(rep.program, sum(rep.counts.flops.values()))
    max_bytes = max_bytes or DEFAULT_MAX_BYTES
    max_seconds = max_seconds or DEFAULT_MAX_SECONDS
    if mem * world > max_bytes or secs * world > max_seconds:
        return {"status": "skipped",
                "reason": f"over budget for {world} ranks (~{mem * world / 2**30:.1f} GiB, "
                          f"~{secs * world:.0f} s); shapes are not reduced for a per-rank "
                          f"program yet"}
    ranks = _run_ranks(rep, problem, world, tp, seed, ep)
    errors = [r["error"] for r in ranks if r.get("error")]
    if errors:
        return {"status": "skipped", "reason": errors[0],
                "seconds": time.perf_counter() - t0}
    low0 = ranks[0]["lowered"]
    if _structure(low0.program) != _structure(rep.program):
        return {"status": "skipped",
                "reason": "rank 0's program re-traced with real tensors has a different kernel "
                          "structure than the analyzed one", "seconds": time.perf_counter() - t0}
    from ...ir.execute import ExecutionError, execute_spmd
    # rank 0 runs the analyzed IR itself (one program, one verdict), fed with the values its
    # own trace bound by name; the other ranks run their own programs (a rank's program can
    # differ from rank 0's)
    lowered = [r["lowered"] for r in ranks]
    from ...ir.model import EXTERNAL_ROLES

    def external(p):
        return {(t.name, t.shape, t.dtype) for t in p.tensors if t.role in EXTERNAL_ROLES}
    if external(rep.program) == external(low0.program):
        lowered[0] = rep.lowered
    p = lowered[0].program
    src_dtype = tolerance_dtype(p)
    tol = tolerance(src_dtype, max_reduction(p), operator_calls(p) + len(rep.counts.collectives))
    try:
        arrays = execute_spmd([low.program for low in lowered],
                              [r["gold"]["feeds"] for r in ranks])
    except ExecutionError as e:
        return {"status": "failed", "reason": f"IR execution error: {e}", "tolerance": tol,
                "seconds": time.perf_counter() - t0}
    per_rank = [compare(low, arr, r["gold"]["golden"], tol, _InputScale(low.program, arr))
                for low, r, arr in zip(lowered, ranks, arrays)]
    return per_rank_result(per_rank, tol, f"the module's forward on {world} ranks at once "
                           f"(threaded process group: real collectives), each rank its own "
                           f"model and inputs", time.perf_counter() - t0,
                           tolerance_rule=tolerance_rule(src_dtype))


def _run_ranks(rep, problem, world: int, tp: int, seed: int, ep_degree: int = 1) -> list[dict]:
    """Every rank built, traced and run under the threaded process group."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg
    from .reference import HarnessError, _build_real, run_original
    from .stacks import export_and_lower

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    build_lock = threading.Lock()
    barrier = threading.Barrier(world)
    out: list[dict] = [{} for _ in range(world)]
    reroll = getattr(rep, "reroll", True)

    def rank(r: int) -> None:
        dist.init_process_group("threaded", rank=r, world_size=world, store=store)
        try:
            # a tensor-parallel model: every rank the same full model and inputs, one rank
            # at a time (the global RNG), so each rank's shard is its slice of one model and
            # the inputs are replicated (the run is the sharded model's); a per-rank program
            # builds at once on every rank (its constructor may communicate: DTensor's
            # distribute_tensor scatters from rank 0), each rank its own values
            if tp > 1 or ep_degree > 1:
                with build_lock:
                    model, inputs = _build_real(problem, seed)
                    from .parallel import expert_parallel, tensor_parallel
                    model = tensor_parallel(model, tp)
                    model = expert_parallel(model, ep_degree)
            else:
                model, inputs = _build_real(problem, seed + r)
            with build_lock:                       # tracing, one rank at a time
                traced = model
                from .dtensor import has_dtensors, localize
                if has_dtensors(model) and tp == ep_degree == 1:   # parallelize_module
                    traced = localize(model, tuple(inputs))      # (traced below DTensor)
                with torch.no_grad() if tp > 1 or ep_degree > 1 else _null():
                    ep, low = export_and_lower(traced, tuple(inputs), rep.source,
                                               reroll_layers=reroll)
            out[r]["lowered"] = low
            barrier.wait()
            routing = getattr(ep, "solbound_routing", None)
            from .routing import ForcedRouting
            # the model runs under the routing it was traced with
            with torch.no_grad(), ForcedRouting(routing) if routing else _null():
                gold = run_original(traced, tuple(inputs), low, ep)
                if traced is not model:          # the outputs of the module itself
                    from torch.distributed.tensor import DTensor
                    from .reference import _to_np, output_leaves
                    leaves = [v.to_local() if isinstance(v, DTensor) else v
                              for v in output_leaves(model(*inputs))]
                    it = iter(leaves)
                    gold["golden"] = [_to_np(next(it)) if o["kind"] == "output" else g
                                      for o, g in zip(low.outputs, gold["golden"])]
                out[r]["gold"] = gold
        except threading.BrokenBarrierError:
            out[r]["error"] = "another rank failed"
        except HarnessError as e:
            out[r]["error"] = f"rank {r}: {e}"
            barrier.abort()
        except Exception as e:  # noqa: BLE001 - one line for the report
            from ..loading import oneline
            out[r]["error"] = f"rank {r}: {oneline(e)}"
            barrier.abort()
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    first = next((o for o in out if o.get("error") and o["error"] != "another rank failed"),
                 None)
    if first is not None:
        for o in out:
            o["error"] = first["error"]
    return out


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


__all__ = ["validate_spmd"]
