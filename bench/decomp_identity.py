"""Is solbound's faster ``run_decompositions`` the same decomposition as torch's own?

solbound patches only the composite-implicit operators whose callable differs from their
own composite kernel (``capture._override_only_what_changes``). This exports every
KernelBench problem of the levels asked for once, decomposes it with torch's override
(every composite operator patched) and with solbound's, and compares the two programs
node by node: name, target, arguments, and the metadata the lowering reads (``from_node``
roots, module stacks, source lines). Prints the time of both and every difference.

    python bench/decomp_identity.py /path/to/KernelBench/KernelBench --levels 1 2 3
"""
import argparse
import glob
import importlib.util
import os
import sys
import time
import warnings


def signature(ep):
    rows = []
    for n in ep.graph.nodes:
        fn = n.meta.get("from_node") or []
        rows.append((n.op, n.name, str(n.target), str(n.args), str(n.kwargs),
                     fn[0].name if fn else None,
                     tuple((n.meta.get("nn_module_stack") or {}).keys()),
                     n.meta.get("stack_trace")))
    return rows, str(ep.graph_signature)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--levels", nargs="+", default=["1", "2", "3"])
    a = ap.parse_args()
    import torch
    import torch.export.exported_program as ep_mod
    from solbound.frontends.torch.capture import (_decomp_table, _quiet_torch_logs,
                                                  decompose_program)
    _decomp_table()                                   # installs solbound's override
    fast = ep_mod._override_composite_implicit_decomp
    slow = fast._solbound_original
    times = {"torch": 0.0, "solbound": 0.0}
    same = differ = failed = 0
    for lvl in a.levels:
        for path in sorted(glob.glob(os.path.join(a.root, f"level{lvl}", "*.py"))):
            name = f"L{lvl} {os.path.basename(path)}"
            try:
                spec = importlib.util.spec_from_file_location("kb_problem", path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                with torch.device("meta"):
                    model = mod.Model(*mod.get_init_inputs())
                    args = tuple(mod.get_inputs())
                with warnings.catch_warnings(), _quiet_torch_logs():
                    warnings.simplefilter("ignore")
                    ep = torch.export.export(model, args, strict=False)
                    out = {}
                    for label, fn in (("torch", slow), ("solbound", fast)):
                        ep_mod._override_composite_implicit_decomp = fn
                        t = time.perf_counter()
                        out[label] = signature(decompose_program(ep, _decomp_table()))
                        times[label] += time.perf_counter() - t
                    ep_mod._override_composite_implicit_decomp = fast
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"{name}: not compared ({type(e).__name__}: {str(e)[:100]})")
                continue
            if out["torch"] == out["solbound"]:
                same += 1
            else:
                differ += 1
                print(f"{name}: DIFFERS")
    print(f"identical {same}, different {differ}, not compared {failed}; "
          f"run_decompositions: torch's override {times['torch']:.1f} s, "
          f"solbound's {times['solbound']:.1f} s")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
