"""A plan's step as MLCommons Chakra execution traces, one file a rank
(``PREFIX.RANK.et``), for ASTRA-sim to replay on other topologies.

The format is Chakra's protobuf schema (``schema/protobuf/et_def.proto``, mlcommons/chakra
at 21585d8): a length-prefixed ``GlobalMetadata`` then length-prefixed ``Node`` messages.
The chakra package does not install from the package index, so the messages are built here
from a descriptor with the schema's own field numbers (the subset written: ``Node``,
``IOInfo``, ``GlobalMetadata``, ``AttributeProto`` with the values used).

A rank's trace is its stage's operations in the schedule's order
(``schedules.pipeline``): each forward, input gradient and weight gradient a compute node
(``num_ops``: its FLOPs, ``tensor_size``: its fused DRAM bytes, ``duration_micros``: its
bound; ``solbound_macs``, ``solbound_seconds``), each followed by a collective node for its
tensor-parallel all-reduces (``comm_size``: their payload in all), activations received
from the previous stage before a forward and sent to the next after it (gradients the other
way), then the data-parallel gradient collective(s) and the optimizer. Ranks are numbered
TP innermost, then CP, then DP, then stages (``planning.search``); a context-parallel
plan adds, after each forward and backward, its ranks' key/value all-gathers and the
reduce-scatter of their gradients.
"""

from __future__ import annotations

import os

# CollectiveCommType and NodeType values of et_def.proto
ALL_REDUCE, ALL_GATHER, ALL_TO_ALL, REDUCE_SCATTER = 0, 2, 6, 7
COMP_NODE, COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 4, 5, 6, 7
SCHEMA = "1.0.2-chakra.1.0.0"

_classes = None


def messages():
    """``(GlobalMetadata, Node, AttributeProto)`` message classes of Chakra's schema."""
    global _classes
    if _classes is not None:
        return _classes
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="solbound_et_def.proto",
                                            package="ChakraProtoMsg", syntax="proto3")

    def msg(name, fields, oneof=None):
        m = fd.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, in_oneof in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if in_oneof:
                f.oneof_index = 0
        return m
    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("AttributeProto", [
        ("name", 1, F.TYPE_STRING, opt, "", False),
        ("doc_string", 2, F.TYPE_STRING, opt, "", False),
        ("double_val", 3, F.TYPE_DOUBLE, opt, "", True),
        ("int32_val", 7, F.TYPE_INT32, opt, "", True),
        ("int64_val", 9, F.TYPE_INT64, opt, "", True),
        ("uint64_val", 13, F.TYPE_UINT64, opt, "", True),
        ("bool_val", 27, F.TYPE_BOOL, opt, "", True),
        ("string_val", 29, F.TYPE_STRING, opt, "", True)], oneof="value")
    msg("GlobalMetadata", [("version", 1, F.TYPE_STRING, opt, "", False),
                           ("attr", 2, F.TYPE_MESSAGE, rep, ".ChakraProtoMsg.AttributeProto",
                            False)])
    msg("IOInfo", [("values", 1, F.TYPE_STRING, opt, "", False),
                   ("shapes", 2, F.TYPE_STRING, opt, "", False),
                   ("types", 3, F.TYPE_STRING, opt, "", False)])
    msg("Node", [("id", 1, F.TYPE_UINT64, opt, "", False),
                 ("name", 2, F.TYPE_STRING, opt, "", False),
                 ("type", 3, F.TYPE_INT32, opt, "", False),      # the NodeType enum's wire
                 ("ctrl_deps", 4, F.TYPE_UINT64, rep, "", False),
                 ("data_deps", 5, F.TYPE_UINT64, rep, "", False),
                 ("start_time_micros", 6, F.TYPE_UINT64, opt, "", False),
                 ("duration_micros", 7, F.TYPE_UINT64, opt, "", False),
                 ("inputs", 8, F.TYPE_MESSAGE, opt, ".ChakraProtoMsg.IOInfo", False),
                 ("outputs", 9, F.TYPE_MESSAGE, opt, ".ChakraProtoMsg.IOInfo", False),
                 ("attr", 10, F.TYPE_MESSAGE, rep, ".ChakraProtoMsg.AttributeProto", False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    get = message_factory.GetMessageClass
    _classes = tuple(get(pool.FindMessageTypeByName(f"ChakraProtoMsg.{n}"))
                     for n in ("GlobalMetadata", "Node", "AttributeProto"))
    return _classes


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read(path: str) -> tuple:
    """``(GlobalMetadata, [Node, ...])`` of a trace file (for tests and users)."""
    Meta, Node, _ = messages()
    data = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(data):
        n, shift = 0, 0
        while True:
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append(data[pos:pos + n])
        pos += n
    meta = Meta()
    meta.ParseFromString(out[0])
    nodes = []
    for raw in out[1:]:
        node = Node()
        node.ParseFromString(raw)
        nodes.append(node)
    return meta, nodes


def attrs(node) -> dict:
    """A node's attributes by name (their set value)."""
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def export(plan, profile, spec, prefix: str, search=None) -> list[str]:
    """Write ``PREFIX.RANK.et`` for every rank of ``plan``; the paths."""
    from .context import ulysses_bytes
    from .search import _stage_parts, rank_profile, replay
    if plan.schedule == "dualpipe":
        from ..schedules.pipeline import ScheduleError
        raise ScheduleError("a Chakra trace of a DualPipe plan is not written yet (a rank "
                            "holds two stages, sending both ways)")
    Meta, Node, Attr = messages()
    rows, sim, _ = replay(plan, profile, spec, search)
    profile = rank_profile(profile, plan.cp, search.memo if search is not None else {})
    tp, cp, dp, pp = plan.tp, plan.cp, plan.dp, plan.pp
    hop = tp * cp * dp                                # ranks between two stages
    hb, kv = int(profile.hidden_bytes), int(profile.kv_bytes)
    paths = []
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    for rank in range(plan.chips):
        t, c_, d, s = rank % tp, (rank // tp) % cp, (rank // (tp * cp)) % dp, rank // hop
        row = rows[s]
        parts = _stage_parts(profile, row["layers"], row["first"], row["last"],
                             plan.recompute)
        nodes: list = []

        def node(name, kind, deps, **a):
            n = Node(id=len(nodes), name=name, type=kind, data_deps=deps)
            for k, v in a.items():
                field = {bool: "bool_val", str: "string_val", float: "double_val"}.get(
                    type(v), "uint64_val" if k == "tensor_size" else
                    "int32_val" if k in ("comm_src", "comm_dst", "comm_tag") else "int64_val")
                n.attr.append(Attr(name=k, **{field: v}))
            nodes.append(n)
            return n.id
        last = None
        tp_calls = {"F": 2 * row["layers"] + (1 if row["first"] else 0),
                    "B": 2 * row["layers"] + (1 if row["last"] else 0)
                    + (2 * row["layers"] if plan.recompute == "full" else 0)}
        # context parallel: a layer's keys and values gathered (forward; backward, twice
        # with full recompute), their gradients reduce-scattered (backward)
        n, again = row["layers"], 2 if plan.recompute == "full" else 1
        cp_colls = {"F": [("all_gather_kv", ALL_GATHER, n, kv)],
                    "B": [("all_gather_kv", ALL_GATHER, n * again, kv),
                          ("reduce_scatter_dkv", REDUCE_SCATTER, n, kv)]}
        if plan.ulysses:   # all-to-alls of q, k, v and the output (a rank's share), and back
            a2a = ulysses_bytes(profile)
            cp_colls = {"F": [("all_to_all_qkvo", ALL_TO_ALL, n, a2a)],
                        "B": [("all_to_all_qkvo", ALL_TO_ALL, n * again, a2a)]}
        for kind, i, c, start, end in sim.order[s]:
            deps = [last] if last is not None else []
            kinds = ("B", "W") if kind == "BW" else (kind,)
            if kind == "F" and s > 0:
                deps.append(node(f"recv_act_mb{i}", COMM_RECV_NODE, [],
                                 comm_src=rank - hop, comm_dst=rank, comm_size=hb,
                                 comm_tag=i))
            if kind in ("B", "BW") and s < pp - 1:
                deps.append(node(f"recv_grad_mb{i}", COMM_RECV_NODE, [],
                                 comm_src=rank + hop, comm_dst=rank, comm_size=hb,
                                 comm_tag=i))
            for k in kinds:
                part = parts[k]
                secs = row["t"][k] / plan.chunks
                last = node(f"{k}_mb{i}_chunk{c}", COMP_NODE, deps,
                            num_ops=int(part.flops / plan.chunks),
                            tensor_size=int(part.bytes / plan.chunks),
                            solbound_macs=int(part.macs / plan.chunks),
                            solbound_seconds=float(secs), is_cpu_op=False)
                nodes[last].duration_micros = max(1, int(round(secs * 1e6)))
                deps = [last]
                if tp > 1 and tp_calls.get(k):
                    last = node(f"tp_all_reduce_{k}_mb{i}", COMM_COLL_NODE, deps,
                                comm_type=ALL_REDUCE,
                                comm_size=hb * tp_calls[k] // plan.chunks,
                                pg_name=f"tp_stage{s}_cp{c_}_dp{d}")
                    deps = [last]
                for name, ctype, calls, size in (cp_colls.get(k, ()) if cp > 1 else ()):
                    last = node(f"cp_{name}_{k}_mb{i}", COMM_COLL_NODE, deps,
                                comm_type=ctype, comm_size=size * calls // plan.chunks,
                                pg_name=f"cp_stage{s}_tp{t}_dp{d}")
                    deps = [last]
            if kind == "F" and s < pp - 1:
                node(f"send_act_mb{i}", COMM_SEND_NODE, [last], comm_src=rank,
                     comm_dst=rank + hop, comm_size=hb, comm_tag=i)
            if kind in ("B", "BW") and s > 0:
                node(f"send_grad_mb{i}", COMM_SEND_NODE, [last], comm_src=rank,
                     comm_dst=rank - hop, comm_size=hb, comm_tag=i)
        if dp * cp > 1:            # the stage's data- and context-parallel ranks
            grads = int(profile.state_at("gradients", row["layers"], row["first"], row["last"]))
            pg = f"dp_cp_stage{s}_tp{t}" if cp > 1 else f"dp_stage{s}_tp{t}"
            last = node("dp_gradients", COMM_COLL_NODE, [last],
                        comm_type=ALL_REDUCE if plan.zero < 2 else REDUCE_SCATTER,
                        comm_size=grads, pg_name=pg)
            if plan.zero >= 3:
                params = int(profile.state_at("parameters", row["layers"], row["first"],
                                              row["last"]))
                last = node("dp_parameters", COMM_COLL_NODE, [last], comm_type=ALL_GATHER,
                            comm_size=2 * params, pg_name=pg)
        opt, shard = parts["O"], (dp * cp if plan.zero >= 1 else 1)
        last = node("optimizer", COMP_NODE, [last], num_ops=int(opt.flops / shard),
                    tensor_size=int(opt.bytes / shard),
                    solbound_seconds=float(row["t"]["O"] / shard), is_cpu_op=False)
        meta = Meta(version=SCHEMA)
        for k, v in (("schema", SCHEMA), ("generator", "solbound plan"),
                     ("plan", plan.label()), ("arch", spec.id)):
            meta.attr.append(Attr(name=k, string_val=v))
        path = f"{prefix}.{rank}.et"
        with open(path, "wb") as f:
            for m in [meta] + nodes:
                raw = m.SerializeToString()
                f.write(_varint(len(raw)) + raw)
        paths.append(path)
    return paths
