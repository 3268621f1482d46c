"""Read solbound's Chakra execution traces with Chakra's own schema and reader.

The chakra package does not install from the package index (its build pulls
HolisticTraceAnalysis from git), so this check builds the part of it that reads a trace
from a checkout of mlcommons/chakra: ``schema/protobuf/et_def.proto`` compiled by
``grpc_tools.protoc`` (``pip install grpcio-tools``, what Chakra's own build uses), its
``src/third_party/utils/protolib.py`` (``openFileRd``, ``decodeMessage``) and its
``src/jsonizer/jsonizer.py`` (the ``chakra_jsonizer`` command), laid out as the package
``chakra`` installs them (``pyproject.toml``'s package-dir). Then it writes the traces of
two plans with ``solbound plan --chakra`` (TP 2 x PP 2 x DP 2; TP 2 x CP 2 x PP 2) and, for
every rank's file:

* runs ``python -m chakra.src.jsonizer.jsonizer`` on it (Chakra's trace-to-JSON tool);
* decodes it with Chakra's ``GlobalMetadata`` and ``Node`` messages and ``decodeMessage``,
  and compares every node (id, name, type, data dependencies, attributes) with solbound's
  own reader (``planning.chakra.read``).

    git clone https://github.com/mlcommons/chakra    # or any checkout, bare or not
    python bench/chakra_check.py /path/to/chakra

A bare repository (a git directory) is read at its HEAD with ``git show``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile

FILES = {  # path in the checkout -> path in the installed package
    "schema/protobuf/et_def.proto": "chakra/schema/protobuf/et_def.proto",
    "src/third_party/utils/protolib.py": "chakra/src/third_party/utils/protolib.py",
    "src/jsonizer/jsonizer.py": "chakra/src/jsonizer/jsonizer.py",
}


def _read(checkout: str, path: str) -> bytes:
    if os.path.exists(os.path.join(checkout, path)):
        with open(os.path.join(checkout, path), "rb") as f:
            return f.read()
    return subprocess.run(["git", "-C", checkout, "show", f"HEAD:{path}"], check=True,
                          capture_output=True).stdout


def build(checkout: str, root: str) -> str:
    """Chakra's reader under ``root`` (importable as ``chakra``); returns Chakra's commit."""
    from grpc_tools import protoc
    for src, dst in FILES.items():
        out = os.path.join(root, dst)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(_read(checkout, src))
    for d, _, _ in os.walk(os.path.join(root, "chakra")):
        open(os.path.join(d, "__init__.py"), "a").close()
    proto = os.path.join(root, "chakra/schema/protobuf")
    if protoc.main(["protoc", f"-I{proto}", f"--python_out={proto}",
                    os.path.join(proto, "et_def.proto")]) != 0:
        raise SystemExit("protoc could not compile Chakra's et_def.proto")
    head = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    return head or "(not a git checkout)"


def _check(path, env, et_def, protolib, MessageToDict, read, attrs) -> int:
    """Chakra's jsonizer on ``path``, and every node Chakra decodes against solbound's."""
    name = os.path.basename(path)
    js = path + ".json"
    r = subprocess.run([sys.executable, "-m", "chakra.src.jsonizer.jsonizer",
                        "--input_filename", path, "--output_filename", js], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"chakra_jsonizer failed on {name}: {r.stderr.strip()}")
    f = protolib.openFileRd(path)
    meta = et_def.GlobalMetadata()
    protolib.decodeMessage(f, meta)
    theirs = []
    node = et_def.Node()
    while protolib.decodeMessage(f, node):
        theirs.append(MessageToDict(node, preserving_proto_field_name=True))
        node = et_def.Node()
    f.close()
    meta_ours, ours = read(path)
    assert meta.version == meta_ours.version, (meta.version, meta_ours.version)
    assert len(theirs) == len(ours), (name, len(theirs), len(ours))
    for t, o in zip(theirs, ours):
        # MessageToDict leaves out fields at their default (id 0, an empty list)
        assert int(t.get("id", 0)) == o.id and t["name"] == o.name, (t, o)
        assert t.get("type", et_def.NodeType.Name(0)) == et_def.NodeType.Name(o.type)
        assert [int(x) for x in t.get("data_deps", [])] == list(o.data_deps)
        got = {a["name"]: next(iter(v for k, v in a.items() if k != "name"))
               for a in t.get("attr", [])}
        for k, v in attrs(o).items():
            g = got[k]
            assert (str(g) == str(v) or (isinstance(v, float) and float(g) == v)
                    or g == v), (name, o.name, k, g, v)
    with open(js) as fj:
        size = len(fj.read())
    kinds = sorted({t.get("type") for t in theirs})
    print(f"  {name}: {len(theirs)} nodes ({', '.join(kinds)}), version {meta.version!r}; "
          f"chakra_jsonizer wrote {size:,} characters of JSON")
    return len(theirs)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[-2])
    checkout = sys.argv[1]
    from google.protobuf.json_format import MessageToDict

    from solbound.cli import main as cli
    from solbound.planning.chakra import attrs, read
    with tempfile.TemporaryDirectory() as tmp:
        commit = build(checkout, os.path.join(tmp, "pkg"))
        sys.path.insert(0, os.path.join(tmp, "pkg"))
        et_def = importlib.import_module("chakra.schema.protobuf.et_def_pb2")
        protolib = importlib.import_module("chakra.src.third_party.utils.protolib")
        from transformers import LlamaConfig
        LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=256).save_pretrained(os.path.join(tmp, "tiny"))
        env = dict(os.environ, PYTHONPATH=os.path.join(tmp, "pkg") + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        total = files_all = 0
        for tag, degrees in (("tp2-pp2-dp2", ["--tp", "2", "--pp", "2"]),
                             ("tp2-cp2-pp2", ["--tp", "2", "--cp", "2", "--pp", "2"])):
            prefix = os.path.join(tmp, tag, "step")
            assert cli(["plan", os.path.join(tmp, "tiny"), "--train", "--chips", "8", "--arch",
                        "h100-sxm", "--global-batch", "16", "--seq", "32", *degrees,
                        "--chakra", prefix, "--top", "1", "-q"]) == 0
            files = sorted(f for f in os.listdir(os.path.dirname(prefix)) if f.endswith(".et"))
            print(f"Chakra {commit[:12]}: {len(files)} trace(s) of the fastest {tag} plan")
            for name in files:
                total += _check(os.path.join(os.path.dirname(prefix), name), env, et_def,
                                protolib, MessageToDict, read, attrs)
            files_all += len(files)
        print(f"every node of {files_all} rank files ({total} nodes) reads the same with "
              f"Chakra's schema and reader as with solbound's")


if __name__ == "__main__":
    main()
