"""Programs beyond one chip: collectives per rank, link figures, the bound with
communication, transformers' tensor-parallel plan, validation on every rank at once.
Every number is a closed form of the program's sizes and the catalog's link figures."""

import json
import os
import threading

import numpy as np
import pytest

import solbound
from solbound.api import analyze_source
from solbound.bounds.comm import CommError, factor, link
from solbound.hardware.catalog import SpecError, catalog, load_spec, spec_from_file
from solbound.ir.execute import ExecutionError, execute, execute_spmd
from solbound.ir.text import parse_program, print_program

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TP_MLP = os.path.join(ROOT, "examples", "parallel", "tp_mlp.py")
RANK = os.path.join(HERE, "programs", "collectives_rank.py")
LLAMA = os.path.join(HERE, "programs", "tiny_llama_tp.py")

pytestmark = pytest.mark.xdist_group("distributed")   # process groups are process-global


# --- the catalog's links ----------------------------------------------------------------

LINKED = {"h100-sxm": (450e9, 8, True), "h200": (450e9, 8, True), "b200": (900e9, 8, True),
          "gb200-nvl72": (900e9, 72, True), "a100-sxm": (300e9, 8, False),
          "mi300x": (448e9, 8, False), "tpu-v5e": (200e9, 256, False)}


def test_links_in_the_catalog_with_sources():
    for arch, (bw, domain, nvls) in LINKED.items():
        s = load_spec(arch)
        assert (s.links["scale_up"], s.links["scale_up_domain"],
                s.links["in_network_reduction"]) == (bw, domain, nvls), arch
        for key in ("scale_up", "scale_up_domain", "in_network_reduction", "scale_out"):
            assert s.source(f"links.{key}").strip(), (arch, key)
    assert not load_spec("h100-pcie").links          # no figures: nothing is invented


def test_link_schema_checked(tmp_path):
    base = open(os.path.join(os.path.dirname(solbound.__file__), "hardware", "specs",
                             "h100-sxm.toml")).read()
    bad = base.replace('in_network_reduction = { value = true', 'in_network_reduction = { value = 1')
    p = tmp_path / "chip.toml"
    p.write_text(bad)
    with pytest.raises(SpecError, match="links.in_network_reduction: value 1 is not true or false"):
        spec_from_file(str(p))
    p.write_text(base.replace("scale_up = { value = 450e9,", "scale_up = { value = -1,"))
    with pytest.raises(SpecError, match="links.scale_up: value -1 is not a positive number"):
        spec_from_file(str(p))


def test_factors_and_links():
    assert factor("all_reduce", 8, False) == 2 * 7 / 8
    assert factor("all_reduce", 8, True) == 7 / 8
    for kind in ("all_gather", "reduce_scatter", "all_to_all"):
        assert factor(kind, 4, True) == factor(kind, 4, False) == 3 / 4
    assert factor("permute", 2, False) == 1.0 and factor("all_reduce", 1, False) == 0.0
    h100 = load_spec("h100-sxm")
    assert link(h100, 8).name == "scale_up" and link(h100, 8).bandwidth == 450e9
    assert link(h100, 16).name == "scale_out" and link(h100, 16).bandwidth == 50e9
    assert not link(h100, 16).in_network
    assert link(load_spec("gb200-nvl72"), 72).name == "scale_up"
    with pytest.raises(CommError, match="h100-pcie has no link figures"):
        link(load_spec("h100-pcie"), 2)


def test_a_group_across_domains_is_hierarchical():
    """16 ranks on 8-GPU H100 boards: an all-reduce moves (8-1)/8 of its payload over
    NVLink (NVLS) inside the board and the 2-board all-reduce of an eighth of it over
    InfiniBand; the bound is the slower of the two, never the whole payload over IB."""
    from solbound.bounds.comm import hops
    h100, p = load_spec("h100-sxm"), 16 * 4096 * 2
    rep = analyze_source(TP_MLP, arch="h100-sxm", world_size=16)
    (c,) = rep.counts.collectives
    assert c.bytes == p and c.ranks == 16
    assert rep.bound("h100-sxm").comm_seconds == pytest.approx(
        max(p * 7 / 8 / 450e9, (p // 8) * 2 * 1 / 2 / 50e9), rel=1e-12)
    # a data-parallel group strided across boards (one member per board): all over IB
    assert hops(h100, "all_reduce", (0, 8, 16, 24), p) == [("scale_out", 1.5, p, 50e9)]
    assert hops(h100, "all_to_all", tuple(range(16)), p) == [
        ("scale_up", 7 / 8, p, 450e9), ("scale_out", 8 / 16, p, 50e9)]
    # a permute between boards crosses; one inside a board does not
    ring = tuple((i, (i + 1) % 16) for i in range(16))
    assert hops(h100, "permute", tuple(range(16)), p, ring)[0][0] == "scale_out"
    assert hops(h100, "permute", tuple(range(16)), p, ((0, 1), (1, 0)))[0][0] == "scale_up"


# --- the IR: collective kernels, their text and their execution ------------------------

IR = '''
x = input(f32[4, 3])
ar = output(f32[4, 3])
ag = output(f32[8, 3])
rs = output(f32[2, 3])
a2a = output(f32[4, 3])

@kernel(d0=4, d1=3, a0_0=4, a0_1=3)
@library(name="all_reduce", ranks=2, group=(0, 1), op="sum")
def k_ar():
    ar[d0, d1] = operands(x[a0_0, a0_1])

@kernel(d0=8, d1=3, a0_0=4, a0_1=3)
@library(name="all_gather", ranks=2, group=(0, 1))
def k_ag():
    ag[d0, d1] = operands(x[a0_0, a0_1])

@kernel(d0=2, d1=3, a0_0=4, a0_1=3)
@library(name="reduce_scatter", ranks=2, group=(0, 1), op="sum")
def k_rs():
    rs[d0, d1] = operands(x[a0_0, a0_1])

@kernel(d0=4, d1=3, a0_0=4, a0_1=3)
@library(name="all_to_all", ranks=2, group=(0, 1))
def k_a2a():
    a2a[d0, d1] = operands(x[a0_0, a0_1])
'''


def test_collective_ir_round_trips_and_runs_on_every_rank():
    p = parse_program(IR)
    assert print_program(parse_program(print_program(p))) == print_program(p)
    xs = [np.arange(12, dtype=np.float32).reshape(4, 3) * (r + 1) for r in range(2)]
    outs = execute_spmd(p, [{"x": x} for x in xs])
    for r in range(2):
        np.testing.assert_array_equal(outs[r]["ar"], xs[0] + xs[1])
        np.testing.assert_array_equal(outs[r]["ag"], np.concatenate(xs))
        np.testing.assert_array_equal(outs[r]["rs"], (xs[0] + xs[1])[2 * r:2 * r + 2])
        np.testing.assert_array_equal(outs[r]["a2a"], np.concatenate(
            [xs[0][2 * r:2 * r + 2], xs[1][2 * r:2 * r + 2]]))
    with pytest.raises(ExecutionError, match="one rank cannot compute it"):
        execute(p, {"x": xs[0]})


# --- PyTorch programs written per rank --------------------------------------------------

def test_tensor_parallel_mlp_closed_form():
    rep = analyze_source(TP_MLP, arch="h100-sxm,a100-sxm,mi300x", world_size=8)
    t, h, f = 16, 4096, 16384
    assert rep.counts.macs == 2 * t * h * (f // 8)           # column then row shard
    (c,) = rep.counts.collectives
    assert (c.kind, c.ranks, c.bytes, c.calls, c.reduce) == ("all_reduce", 8, t * h * 2, 1, "sum")
    expect = {"h100-sxm": t * h * 2 * 7 / 8 / 450e9,          # NVLS: (n-1)/n
              "a100-sxm": t * h * 2 * 2 * 7 / 8 / 300e9,      # ring: 2(n-1)/n
              "mi300x": t * h * 2 * 2 * 7 / 8 / 448e9}
    for b in rep.bounds:
        assert b.comm_seconds == pytest.approx(expect[b.arch], rel=1e-12)
        assert b.seconds == max(b.compute_seconds, b.memory_seconds, b.comm_seconds)
        assert b.no_overlap_seconds == pytest.approx(
            max(b.compute_seconds, b.memory_seconds) + b.comm_seconds)
    d = json.loads(rep.to_json())
    assert d["world_size"] == 8
    assert d["collectives"] == [{"kind": "all_reduce", "bytes": 131072, "ranks": 8, "calls": 1,
                                 "group": list(range(8)), "reduce": "sum",
                                 "kernel": c.kernel, "operator": c.op, "source": "tp_mlp.py:27"}]
    assert {b["arch"]: b["link_bandwidth"] for b in d["bounds"]} == {
        "h100-sxm": 450e9, "a100-sxm": 300e9, "mi300x": 448e9}


def test_every_collective_kind_per_rank_and_validated():
    rep = analyze_source(RANK, arch="h100-sxm", world_size=4, validate=True)
    rows, cols = 8, 16
    got = [(c.kind, c.bytes, c.ranks) for c in rep.counts.collectives]
    assert got == [("all_gather", 4 * rows * cols * 4, 4),      # the gathered tensor
                   ("reduce_scatter", rows * cols * 4, 4),      # the unscattered operand
                   ("all_to_all", rows * cols * 4, 4),
                   ("all_reduce", rows * cols * 4, 4)]
    b = rep.bound("h100-sxm")
    per = (4 * rows * cols * 4 + 2 * rows * cols * 4) * 3 / 4 + rows * cols * 4 * 3 / 4
    assert b.comm_seconds == pytest.approx(per / 450e9, rel=1e-12)
    v = rep.validation
    assert v["status"] == "passed" and v["ranks"] == 4 and v["failed_ranks"] == [], v


def test_validation_catches_a_wrong_collective(monkeypatch):
    """The same program with the IR's all-gather putting the ranks in the wrong order:
    the ranks' real run disagrees."""
    import solbound.ir.collectives as coll
    real = coll.run

    def wrong(kind, params, operands, position):
        if kind == "all_gather":
            return np.concatenate(operands[::-1], axis=0)
        return real(kind, params, operands, position)
    monkeypatch.setattr(coll, "run", wrong)
    rep = analyze_source(RANK, arch="h100-sxm", world_size=4, validate=True)
    assert rep.validation["status"] == "failed"


def test_world_size_errors(tmp_path):
    from solbound.cli import main
    assert main(["analyze", TP_MLP, "--world-size", "0", "--quiet"]) == 2
    assert main(["analyze", TP_MLP, "--world-size", "8", "--arch", "h100-pcie", "--quiet"]) == 2
    assert main(["analyze", TP_MLP, "--tp", "2", "--quiet"]) == 2        # not transformers
    assert main(["analyze", LLAMA, "--tp", "3", "--quiet"]) == 2         # 4 heads
    bad = tmp_path / "uneven.py"
    bad.write_text(open(RANK).read().replace(
        "dist.all_to_all_single(swapped, y)",
        "dist.all_to_all_single(swapped, y, [2, 2, 3, 1], [2, 2, 3, 1])"))
    # not modelled: an unsupported operator, named with its reason (--strict exits 3)
    rep = analyze_source(str(bad), arch="h100-sxm", world_size=4)
    (u,) = rep.unsupported
    assert "all_to_all" in u.operator and "unequal" in u.reason
    assert main(["analyze", str(bad), "--world-size", "4", "--quiet", "--strict"]) == 3


def test_world_size_error_messages(capsys):
    from solbound.cli import main
    main(["analyze", TP_MLP, "--world-size", "8", "--arch", "h100-pcie", "--quiet"])
    assert "h100-pcie has no link figures" in capsys.readouterr().err
    main(["analyze", LLAMA, "--tp", "3", "--quiet"])
    assert "num_attention_heads = 4 does not split over 3 ranks" in capsys.readouterr().err
    main(["analyze", TP_MLP, "--tp", "2", "--quiet"])
    assert "is not a transformers model" in capsys.readouterr().err


# --- transformers' own tensor-parallel plan ---------------------------------------------

def test_llama_tp_plan_closed_form_and_validated():
    rep = analyze_source(LLAMA, arch="h100-sxm", tp=2, validate=True)
    t, h, f, layers, hd, vocab = 8, 64, 128, 3, 16, 256
    heads, kv = 4 // 2, 2 // 2                       # per rank
    causal = t * (t + 1) // 2
    per_layer = (t * h * heads * hd + 2 * t * h * kv * hd + t * heads * hd * h
                 + 3 * t * h * (f // 2) + 2 * heads * hd * causal + 2 * t * h)
    assert rep.counts.macs == layers * per_layer + t * h + t * h * (vocab // 2)
    got = [(c.kind, c.bytes, c.calls) for c in rep.counts.collectives]
    assert got == [("all_reduce", t * h * 4, 1),               # vocabulary-parallel embedding
                   ("all_reduce", t * h * 4, layers),          # o_proj (row-wise)
                   ("all_reduce", t * h * 4, layers),          # down_proj (row-wise)
                   ("all_gather", t * vocab * 4, 1)]           # the LM head's logits
    assert rep.validation["status"] == "passed", rep.validation
    assert rep.lowered.rerolled[0]["trip"] == layers


def _run_ranks(n, fn):
    """``fn(rank)`` on ``n`` threads under PyTorch's threaded process group."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.multi_threaded_pg import _install_threaded_pg
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store, out, lock = dist.HashStore(), [None] * n, threading.Lock()

    def one(r):
        dist.init_process_group("threaded", rank=r, world_size=n, store=store)
        try:
            out[r] = fn(r, lock)
        finally:
            dist.destroy_process_group()
    ts = [threading.Thread(target=one, args=(r,)) for r in range(n)]
    try:
        [t.start() for t in ts]
        [t.join(120) for t in ts]
    finally:
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    return out


def test_sharded_llama_computes_the_unsharded_model():
    """The plan as solbound applies it (transformers' styles, two of them on local shards)
    gives the logits of the model it shards."""
    import torch
    from transformers import LlamaForCausalLM
    from solbound.frontends.torch.parallel import tensor_parallel
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_llama_tp", LLAMA)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    full = LlamaForCausalLM(mod.config()).eval()
    state = {k: v.clone() for k, v in full.state_dict().items()}
    ids = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        want = full(input_ids=ids, use_cache=False).logits

    def rank(r, lock):
        with lock:
            m = LlamaForCausalLM(mod.config()).eval()
            m.load_state_dict(state)
            m = tensor_parallel(m, 2)
        with torch.no_grad():
            return m(input_ids=ids, use_cache=False).logits
    for got in _run_ranks(2, rank):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_parallel_projection_least_degree():
    from solbound.bounds.provision import parallel_projection, resident_bytes
    reps = {d: analyze_source(LLAMA, arch="h100-sxm", tp=d, modes=("fused",)) for d in (1, 2)}
    assert reps[1].counts.collectives == []
    fast = min(b.seconds for b in reps[2].bounds)
    doc = parallel_projection(reps, target=fast * 1.0000001)
    assert doc["least_tp"] == {"h100-sxm": 2}
    row = next(r for r in doc["rows"] if r["tp"] == 2)
    assert row["comm_share"] == pytest.approx(row["comm_seconds"] / row["no_overlap_seconds"])
    assert row["resident_bytes"] == resident_bytes(reps[2]) < resident_bytes(reps[1])


# --- JAX: shard_map over a mesh ------------------------------------------------------------

JAX_MLP = os.path.join(ROOT, "examples", "parallel", "jax_tp_mlp.py")


def test_jax_twin_of_the_tensor_parallel_mlp():
    jx = analyze_source(JAX_MLP, arch="h100-sxm,a100-sxm")
    pt = analyze_source(TP_MLP, arch="h100-sxm,a100-sxm", world_size=8)
    assert jx.world_size == pt.world_size == 8
    assert jx.counts.macs == pt.counts.macs == 2 * 16 * 4096 * (16384 // 8)
    assert [(c.kind, c.bytes, c.ranks) for c in jx.counts.collectives] == \
        [(c.kind, c.bytes, c.ranks) for c in pt.counts.collectives] == [("all_reduce", 131072, 8)]
    for arch in ("h100-sxm", "a100-sxm"):
        assert jx.bound(arch).comm_seconds == pt.bound(arch).comm_seconds


def _kinds_fn(n=4, check_vma=False):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh, PartitionSpec as P
    mesh = AbstractMesh((n,), ("x",))

    def f(x, w1, w2):
        def body(x, w1, w2):
            y = jnp.tanh(x @ w1) @ w2                       # (8, 16) per device
            y = jax.lax.psum(y, "x")
            g = jax.lax.all_gather(y, "x", axis=1, tiled=True)
            s = jax.lax.psum_scatter(y, "x", scatter_dimension=0, tiled=True)
            p = jax.lax.ppermute(y, "x", perm=[(i, (i + 1) % n) for i in range(n)])
            a = jax.lax.all_to_all(y, "x", 0, 0, tiled=True)
            return y, g, s, p, a
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(None, "x"), P("x", None)),
                             out_specs=(P(), P(), P("x"), P("x"), P("x")),
                             check_vma=check_vma)(x, w1, w2)
    args = (jax.ShapeDtypeStruct((8, 16), jnp.float32),
            jax.ShapeDtypeStruct((16, 32), jnp.float32),
            jax.ShapeDtypeStruct((32, 16), jnp.float32))
    return f, args


def test_jax_collectives_closed_form_and_validated_on_devices():
    f, args = _kinds_fn()
    rep = solbound.analyze(f, args, arch="h100-sxm", validate=True)
    assert rep.counts.macs == 8 * 16 * 8 + 8 * 8 * 16
    y = 8 * 16 * 4
    assert [(c.kind, c.bytes) for c in rep.counts.collectives] == [
        ("all_reduce", y), ("all_gather", 4 * y), ("reduce_scatter", y), ("permute", y),
        ("all_to_all", y)]
    link = (y * 3 / 4 + 4 * y * 3 / 4 + y * 3 / 4 + y + y * 3 / 4) / 450e9
    assert rep.bound("h100-sxm").comm_seconds == pytest.approx(link, rel=1e-12)
    v = rep.validation
    assert v["status"] == "passed" and v["ranks"] == 4 and v["failed_ranks"] == [], v


def test_jax_mesh_axes_and_whole_function_rule():
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh, PartitionSpec as P
    from solbound.frontends.contract import FrontendError
    mesh = AbstractMesh((2, 4), ("dp", "tp"))

    def f(x):
        def body(x):
            return jax.lax.psum(x, "tp"), jax.lax.psum(x, "dp")
        return jax.shard_map(body, mesh=mesh, in_specs=P("dp", "tp"),
                             out_specs=(P("dp"), P(None, "tp")), check_vma=False)(x)
    rep = solbound.analyze(f, (jax.ShapeDtypeStruct((4, 8), jnp.float32),), arch="h100-sxm")
    assert rep.world_size == 8
    # rank 0's groups, ranks numbered row-major over (dp, tp)
    assert [(c.ranks, c.group) for c in rep.counts.collectives] == [(4, (0, 1, 2, 3)),
                                                                      (2, (0, 4))]

    def partly(x):
        return jnp.sin(f(x)[0])
    with pytest.raises(FrontendError, match="shard_map at .*: it must be the whole function"):
        solbound.analyze(partly, (jax.ShapeDtypeStruct((4, 8), jnp.float32),))


# --- data parallelism: the training step's gradient all-reduce ---------------------------

def test_data_parallel_step_all_reduces_every_gradient():
    mlp = os.path.join(ROOT, "examples", "train_mlp.py")
    one = analyze_source(mlp, arch="h100-sxm,a100-sxm", train=True)
    dp = analyze_source(mlp, arch="h100-sxm,a100-sxm", train=True, dp=8)
    d_in, d_hidden, d_out = 256, 1024, 16
    grads = [d_hidden * d_in * 4, d_hidden * 4, d_out * d_hidden * 4, d_out * 4]  # fp32
    assert [(c.kind, c.bytes, c.ranks, c.reduce) for c in dp.counts.collectives] == \
        [("all_reduce", g, 8, "avg") for g in grads]
    assert dp.counts.macs == one.counts.macs                # the per-rank step is the same
    assert dp.bound("h100-sxm").comm_seconds == pytest.approx(sum(grads) * 7 / 8 / 450e9)
    assert dp.bound("a100-sxm").comm_seconds == pytest.approx(sum(grads) * 2 * 7 / 8 / 300e9)
    assert dp.validation["status"] == "not requested"
    from solbound.frontends.contract import FrontendError
    with pytest.raises(FrontendError, match="--dp 8: data parallelism adds the training step"):
        analyze_source(mlp, dp=8)


def test_tensor_parallel_attention_twins():
    """The same causal attention block per rank in PyTorch and in a JAX shard_map: equal
    per-rank MACs (column-sharded heads, the causal triangle), one all-reduce of the
    output, both validated on 4 ranks."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh, PartitionSpec as P
    t, d, h, hd, n = 16, 64, 8, 8, 4
    path = os.path.join(HERE, "programs", "tp_attention.py")
    pt = analyze_source(path, arch="h100-sxm", world_size=n, validate=True)
    mesh = AbstractMesh((n,), ("tp",))

    def block(x, wq, wk, wv, wo):
        def rank(x, wq, wk, wv, wo):
            hl = wq.shape[1] // hd
            q, k, v = ((x @ w).reshape(t, hl, hd).transpose(1, 0, 2) for w in (wq, wk, wv))
            s = jnp.einsum("htd,hsd->hts", q, k) / hd ** 0.5
            s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
            o = jnp.einsum("hts,hsd->htd", jax.nn.softmax(s, axis=-1), v)
            return jax.lax.psum(o.transpose(1, 0, 2).reshape(t, hl * hd) @ wo, "tp")
        col, row = P(None, "tp"), P("tp", None)
        return jax.shard_map(rank, mesh=mesh, in_specs=(P(), col, col, col, row),
                             out_specs=P())(x, wq, wk, wv, wo)
    f32 = jnp.float32
    args = (jax.ShapeDtypeStruct((t, d), f32),) + tuple(
        jax.ShapeDtypeStruct((d, h * hd), f32) for _ in range(3)) + (
        jax.ShapeDtypeStruct((h * hd, d), f32),)
    jx = solbound.analyze(block, args, arch="h100-sxm", validate=True)
    hl = h // n
    macs = 3 * t * d * hl * hd + 2 * hl * hd * t * (t + 1) // 2 + t * hl * hd * d
    assert pt.counts.macs == jx.counts.macs == macs
    for rep in (pt, jx):
        assert [(c.kind, c.bytes, c.ranks) for c in rep.counts.collectives] == \
            [("all_reduce", t * d * 4, n)]
        assert rep.validation["status"] == "passed", rep.validation


def test_parallelize_module_dtensor_program():
    """PyTorch's own tensor parallelism (DTensor parameters): traced below DTensor, one
    all-reduce of the row-parallel output, validated on 4 ranks against the DTensor run."""
    path = os.path.join(HERE, "programs", "dtensor_mlp.py")
    rep = analyze_source(path, arch="h100-sxm", world_size=4, validate=True)
    t, d, f = 8, 64, 256
    assert rep.counts.macs == 2 * t * d * (f // 4)
    assert [(c.kind, c.bytes, c.ranks) for c in rep.counts.collectives] == \
        [("all_reduce", t * d * 4, 4)]
    assert rep.validation["status"] == "passed", rep.validation


def test_a_sweep_point_over_parallel_degrees():
    """A sweep's grid names tp, dp and world_size are degrees of the analysis, not
    parameters of the program: each point is analyzed per rank, its rows carry the link
    time."""
    from solbound.sweep.run import run_point
    from solbound.sweep.spec import parse
    s = parse({"program": TP_MLP, "arch": ["h100-sxm"], "modes": ["fused"],
               "grid": {"world_size": [2, 8], "TOKENS": [16]}}, os.path.join(ROOT, "s.toml"))
    from solbound.sweep.spec import check_program
    check_program(s)                        # world_size is not asked of the program
    from solbound.sweep.run import point_item
    rows = [r for p in s.points() for r in run_point(point_item(s, p))]
    p = 16 * 4096 * 2
    assert [(r["world_size"], r["macs"]) for r in rows] == [
        (2, 2 * 16 * 4096 * 16384 // 2), (8, 2 * 16 * 4096 * 16384 // 8)]
    assert rows[0]["comm_seconds"] == pytest.approx(p * 1 / 2 / 450e9)
    assert rows[1]["comm_seconds"] == pytest.approx(p * 7 / 8 / 450e9)


def test_fully_sharded_step():
    """--fsdp 4: every parameter all-gathered where the forward uses it (its full bytes),
    every gradient reduce-scattered (its full bytes), rank 0 holding and stepping a quarter
    of each parameter's rows; the step's MACs are the unsharded step's."""
    mlp = os.path.join(ROOT, "examples", "train_mlp.py")
    one = analyze_source(mlp, arch="h100-sxm", train=True)
    rep = analyze_source(mlp, arch="h100-sxm", train=True, fsdp=4)
    full = [1024 * 256 * 4, 1024 * 4, 16 * 1024 * 4, 16 * 4]
    got = [(c.kind, c.bytes) for c in rep.counts.collectives]
    assert sorted(got) == sorted([("all_gather", b) for b in full]
                                 + [("reduce_scatter", b) for b in full])
    assert rep.counts.macs == one.counts.macs
    assert rep.bound("h100-sxm").comm_seconds == pytest.approx(2 * sum(full) * 3 / 4 / 450e9)
    shard = (256 * 256 + 256 + 4 * 1024 + 4) * 4               # a quarter of each's rows
    mem = rep.training["memory"]
    # AdamW: two moments per element, and a 4-byte step counter per parameter
    assert mem["parameters"] == shard and mem["optimizer_state"] == 2 * shard + 4 * 4
    assert mem["parameters"] * 4 == one.training["memory"]["parameters"]


def test_expert_parallel_moe_layer_per_rank():
    """A GShard-style expert-parallel MoE layer written per rank: one all-to-all of the
    expert slots there and one back, the experts of this rank over every rank's slots,
    validated on 4 ranks. MACs: the router, the two expert products over n x E/n x C slots,
    the slot counting (a sum of products over the one-hot routing) and the scatter-add of
    the kept tokens into their slots."""
    path = os.path.join(HERE, "programs", "ep_moe.py")
    rep = analyze_source(path, arch="h100-sxm,a100-sxm", world_size=4, validate=True)
    t, d, f, e, c, n = 16, 32, 64, 8, 4, 4
    assert rep.counts.macs == t * d * e + 2 * n * (e // n) * c * d * f + t * e + t * d
    buf = e * c * d * 4
    assert [(k.kind, k.bytes, k.ranks) for k in rep.counts.collectives] == \
        [("all_to_all", buf, n), ("all_to_all", buf, n)]
    assert rep.bound("a100-sxm").comm_seconds == pytest.approx(2 * buf * 3 / 4 / 300e9)
    assert rep.validation["status"] == "passed", rep.validation


MIXTRAL = os.path.join(HERE, "programs", "tiny_mixtral_ep.py")


def test_expert_parallel_from_the_models_plan_closed_form_and_validated():
    """``--ep 4`` on a tiny Mixtral: transformers' base_model_ep_plan and AllToAllEP, each
    rank its own 8 tokens and 2 of the 8 experts; balanced routing sends T*k/4 pairs to
    each rank. Per rank: the unsharded model's MACs plus the unit-weight pass the
    receiving experts make over their T*k pairs; per layer three all-to-alls (the
    per-expert counts, the tokens, the results)."""
    rep = analyze_source(MIXTRAL, arch="h100-sxm", ep=4, validate=True)
    t, h, inter, layers, heads, kv, hd, vocab, e, k = 8, 64, 96, 2, 4, 2, 16, 256, 8, 2
    causal = t * (t + 1) // 2
    per_layer = (t * h * heads * hd + 2 * t * h * kv * hd + t * heads * hd * h
                 + 2 * heads * hd * causal + 2 * t * h          # attention, two RMSNorms
                 + t * h * e                                    # router
                 + t * k * (h * 2 * inter + inter * h)          # T*k expert evaluations
                 + t * k * h                                    # routing weights, summed over k
                 + t * k * h)                                   # unit weights on the receiver
    assert rep.counts.macs == layers * per_layer + t * h + t * h * vocab
    got = [(c.kind, c.bytes, c.ranks) for c in rep.counts.collectives]
    assert got == [("all_to_all", e * 8, 4), ("all_to_all", t * k * h * 4, 4),
                   ("all_to_all", t * k * h * 4, 4)] * layers
    assert rep.validation["status"] == "passed", rep.validation
    assert any("every rank routes its own batch" in n for n in rep.program.notes)


def test_expert_parallel_errors(capsys):
    from solbound.cli import main
    assert main(["analyze", MIXTRAL, "--ep", "3", "--quiet"]) == 2     # 8 experts
    assert "Cannot evenly shard 8 experts across 3" in capsys.readouterr().err
    assert main(["analyze", LLAMA, "--ep", "2", "--quiet"]) == 2       # no ep plan
    assert "has no `ep_plan`" in capsys.readouterr().err
    assert main(["analyze", MIXTRAL, "--ep", "2", "--train", "--quiet"]) == 2
    assert "--ep with --train" in capsys.readouterr().err
