"""Python loops over steps captured as one scan (frontends/torch/loops.py) and lowered as
one sequential loop of the IR (frontends/torch/rules/control.py), against the same
program traced unrolled (``reroll=False``)."""

import torch

import solbound
from solbound.frontends.torch import loops

from programs.recurrences import (CallerList, Elman, ElmanLocal, Growing, ListAfter, LoopBack,
                                  Layered, Private, Recurrence, StepValue, Swap, ZerosLgamma)


def _pair(model, args):
    scan = solbound.analyze(model, args, arch="h100-sxm", validate=True)
    unrolled = solbound.analyze(model, args, arch="h100-sxm", reroll=False)
    return scan, unrolled


def _looped(rep) -> set:
    return {k.loop for k in rep.program.kernels if k.loop is not None}


def test_a_selective_scan_is_one_loop_with_the_unrolled_counts():
    b, d, t, n = 2, 8, 6, 4
    args = (torch.randn(b, d, t, n), torch.randn(b, d, t, n), torch.randn(b, t, n),
            torch.randn(b, d, n))
    scan, unrolled = _pair(Recurrence(), args)
    assert scan.validation["status"] == "passed"
    assert len(_looped(scan)) == 1 and ("ts", t, 1) in _looped(scan)
    assert not _looped(unrolled)
    # per step: h (b*d*n) multiply and add, and y = h @ C_t (b*d*n MACs); the stacked
    # rows doubled after the loop (b*d*t)
    assert scan.totals["macs"] == unrolled.totals["macs"] == b * d * n * t
    assert scan.totals["flops"] == unrolled.totals["flops"] == 4 * b * d * n * t + b * d * t
    assert scan.totals["bytes"]["fused"] == unrolled.totals["bytes"]["fused"]
    # unfused: the same operators per step and a copy of each row as torch.stack makes;
    # besides, the initial state (a program input) is copied into the loop's history and
    # the final one (a program output) out of it: 2 x 2 x b*d*n floats
    state = b * d * n * 4
    assert scan.totals["bytes"]["unfused"] == unrolled.totals["bytes"]["unfused"] + 4 * state
    assert any("is one scan of 6 iterations" in n and "recurrences.py:10" in n
               for n in scan.program.notes)
    srcs = {g.src for g in scan.counts.groups if g.op.startswith("scan")}
    assert srcs == {"recurrences.py:10"}, srcs


def test_the_ir_does_not_grow_with_the_trip_count():
    def kernels(t):
        args = (torch.randn(1, 4, t, 2), torch.randn(1, 4, t, 2), torch.randn(1, t, 2),
                torch.randn(1, 4, 2))
        rep = solbound.analyze(Recurrence(), args, arch="h100-sxm")
        return len(rep.program.kernels), rep.totals["macs"]
    (k5, m5), (k40, m40) = kernels(5), kernels(40)
    assert k5 == k40
    assert (m5, m40) == (1 * 4 * 2 * 5, 1 * 4 * 2 * 40)


def test_an_elman_rnn_with_a_zero_state_and_cat():
    torch.manual_seed(0)
    model, x = Elman(), torch.randn(3, 7, 8)
    scan, unrolled = _pair(model, (x,))
    assert scan.validation["status"] == "passed"
    assert len(_looped(scan)) == 1
    # x_t W and h U per step: 2 * 3*8*8 MACs
    assert scan.totals["macs"] == unrolled.totals["macs"] == 2 * 3 * 8 * 8 * 7
    assert scan.totals["flops"] == unrolled.totals["flops"]
    assert scan.totals["bytes"]["fused"] == unrolled.totals["bytes"]["fused"]
    # torch.zeros writes the loop history's first row: no copy in front of the loop. The
    # rows are stacked step-major and returned batch-major, a view the program output is
    # copied out of once (3*7*8 floats read and written); torch.cat wrote them in place
    assert [k.opname for k in scan.program.kernels
            if k.loop is None and k.out.startswith("scan_carry")] == ["aten.zeros"]
    assert scan.totals["bytes"]["unfused"] == unrolled.totals["bytes"]["unfused"] + 2 * 3 * 7 * 8 * 4


def test_a_body_closing_over_tensors_gets_them_as_inputs_not_constants():
    torch.manual_seed(0)
    model, x = ElmanLocal(), torch.randn(3, 7, 8)
    from solbound.frontends.torch.capture import export_program
    ep = export_program(model, (x,))
    (scan,) = [n for n in ep.graph.nodes if str(n.target) == "scan"]
    assert len(scan.args[3]) == 2                  # w and u, passed in
    body = getattr(ep.graph_module, scan.args[0].target)
    assert not [n for n in body.graph.nodes if n.op == "get_attr"]
    rep, unrolled = _pair(model, (x,))
    assert rep.validation["status"] == "passed"
    assert len(_looped(rep)) == 1
    assert rep.totals["macs"] == unrolled.totals["macs"] == 2 * 3 * 8 * 8 * 7
    assert rep.totals["bytes"]["fused"] == unrolled.totals["bytes"]["fused"]


def test_loops_that_are_not_scans_run_unrolled_and_say_why():
    x = torch.randn(2, 3)
    for model, why in ((Growing(), "scan does not take its body"),
                       (StepValue(), "the loop variable i is used other than as one index")):
        rep = solbound.analyze(model, (x,), arch="h100-sxm", validate=True)
        assert rep.validation["status"] != "failed"
        assert not _looped(rep)
        assert any("unrolled" in n and why in n for n in rep.program.notes), rep.program.notes


def test_the_rewrite_leaves_the_function_as_it_was():
    from programs import recurrences
    code = recurrences.selective_scan.__code__
    with loops.capturing(True), loops.loops_as_scans(Recurrence()):
        assert recurrences.selective_scan.__code__ is not code
        args = (torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3), torch.randn(1, 5, 3),
                torch.randn(1, 2, 3))
        got = Recurrence()(*args)
    assert recurrences.selective_scan.__code__ is code
    want = Recurrence()(*args)
    assert all(torch.allclose(a, b) for a, b in zip(got, want))


def test_mamba_called_as_users_call_it_scans_its_time_steps():
    """transformers' Mamba slow path (no CUDA kernels): the time loop is one sequential loop
    per layer, MACs are the closed form, and only the first step's known zero state, which
    the unrolled trace folds, tells the two apart."""
    from transformers import MambaConfig, MambaForCausalLM
    L, t, d, n, V = 2, 12, 32, 4, 96
    cfg = MambaConfig(num_hidden_layers=L, hidden_size=d, state_size=n, vocab_size=V,
                      intermediate_size=2 * d, time_step_rank=4, conv_kernel=3)
    torch.manual_seed(0)
    model = MambaForCausalLM(cfg).eval()
    ids = torch.randint(0, V, (1, t))
    scan, unrolled = _pair(model, (ids,))
    assert scan.validation["status"] == "passed"
    assert len(_looped(scan)) == L and all(lp[1] == t for lp in _looped(scan))
    di, r, k = 2 * d, 4, 3
    per_token = d * 2 * di + di * (r + 2 * n) + r * di + di * n + di * d + d   # + RMSNorm
    conv = di * (k * t - k * (k - 1) // 2)          # taps on the causal padding skipped
    macs = L * (t * per_token + conv) + t * d + t * d * V
    assert scan.totals["macs"] == unrolled.totals["macs"] == macs
    fs, fu = scan.totals["flops_by_unit"], unrolled.totals["flops_by_unit"]
    assert fs["matrix"] == fu["matrix"]
    # step 0 multiplies the zero state (d_inner x n per layer: a multiply and an add) and
    # needs no exp of its decay, which the unrolled trace folds away
    assert fs["vector"] - fu["vector"] == 2 * L * di * n
    assert fs["special"] - fu["special"] == L * di * n
    assert scan.totals["bytes"]["fused"] == unrolled.totals["bytes"]["fused"]


RNN_FILE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, i, h, o):
        super().__init__()
        self.i2h = nn.Linear(i + h, h)
        self.h2o = nn.Linear(h, o)

    def forward(self, x, h0):
        """A docstring of two lines,
        indented as a method's is."""
        hidden = h0
        outputs = []
        for t in range(x.shape[0]):
            combined = torch.cat((x[t], hidden), dim=1)
            hidden = torch.tanh(self.i2h(combined))
            outputs.append(self.h2o(hidden))
        return torch.stack(outputs, dim=0)

T, B, I, H, O = 9, 2, 5, 4, 3

def get_inputs():
    return [torch.rand(T, B, I), torch.rand(B, H)]

def get_init_inputs():
    return [I, H, O]
'''


def test_a_kernelbench_style_file_scans_its_time_loop(tmp_path):
    """A program file (imported as a module of its own, as ``solbound analyze FILE`` does)
    whose body calls its modules (closing over ``self``: the scan's body then goes through
    TorchDynamo)."""
    f = tmp_path / "rnn.py"
    f.write_text(RNN_FILE)
    rep = solbound.analyze_source(str(f), arch="h100-sxm", validate=True)
    assert rep.validation["status"] == "passed"
    assert any("rnn.py:16 (Model.forward) is one scan of 9 iterations" in n
               for n in rep.program.notes), rep.program.notes
    assert len(_looped(rep)) == 1
    T, B, I, H, O = 9, 2, 5, 4, 3
    assert rep.totals["macs"] == T * B * ((I + H) * H + H * O)


def _note(rep, text):
    return any(text in n for n in rep.program.notes)


def test_what_a_scan_would_change_stays_unrolled_and_validates():
    """Found by a review: a list the caller made (its rows would never reach it), a list
    used as a list after the loop, a name private to the inner loop read when the outer
    loop comes round again. Each is named in the notes and validates."""
    x, h = torch.randn(2, 5, 4), torch.randn(2, 4)
    for model, why in ((CallerList(), "the list outs is not made empty in this function"),
                       (ListAfter(), "the list outs is used after the loop other than"),
                       (LoopBack(), "is assigned in the body and read after the loop")):
        rep = solbound.analyze(model, (x, h), arch="h100-sxm", validate=True)
        assert rep.validation["status"] == "passed", type(model).__name__
        assert _note(rep, why), rep.program.notes


def test_carries_that_would_alias_are_copied_and_validate():
    x, a = torch.randn(2, 5, 4), torch.randn(2, 4)
    scan, unrolled = _pair(Swap(), (x, a))
    assert _note(scan, "is one scan of 5 iterations"), scan.program.notes
    assert scan.validation["status"] == "passed"
    assert scan.totals["flops"] == unrolled.totals["flops"]


def test_a_method_reading_a_private_attribute_is_recompiled_in_its_class():
    torch.manual_seed(0)
    x, h = torch.randn(2, 5, 4), torch.randn(2, 4)
    scan, unrolled = _pair(Private(), (x, h))
    assert _note(scan, "is one scan of 5 iterations"), scan.program.notes
    assert scan.validation["status"] == "passed"
    assert scan.totals["macs"] == unrolled.totals["macs"] == 5 * 2 * 4 * 4


def test_an_operator_without_a_rule_in_the_body_is_named_once_and_the_rest_counted():
    x = torch.randn(2, 5, 4)
    scan = solbound.analyze(ZerosLgamma(), (x,), arch="h100-sxm")
    unrolled = solbound.analyze(ZerosLgamma(), (x,), arch="h100-sxm", reroll=False)
    assert [u.operator for u in scan.unsupported] == ["aten.lgamma"]
    assert len(unrolled.unsupported) == 5
    assert scan.totals["flops"] == unrolled.totals["flops"]


def test_a_source_edited_after_import_is_not_what_runs(tmp_path, monkeypatch):
    """The rewrite compiles the function's source: when the file no longer matches the
    loaded code (edited in a notebook session), the function is left alone."""
    import importlib
    import sys
    f = tmp_path / "edited_rnn.py"
    body = "h = torch.tanh(x[:, t] + h)"
    src = ("import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x, h):\n"
           "        for t in range(x.shape[1]):\n            {}\n        return h\n")
    f.write_text(src.format(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("edited_rnn")
    f.write_text(src.format("h = torch.tanh(x[:, t] @ torch.ones(4, 4) + h)"))
    import linecache
    linecache.checkcache()
    rep = solbound.analyze(mod.M(), (torch.randn(2, 5, 4), torch.randn(2, 4)), arch="h100-sxm",
                           validate=True)
    sys.modules.pop("edited_rnn", None)
    assert rep.validation["status"] == "passed"
    assert rep.totals["macs"] == 0
    assert not _note(rep, "scan")


def test_a_time_loop_inside_a_layer_loop_of_the_same_function_is_a_scan():
    x, h = torch.randn(2, 5, 4), torch.randn(2, 4)
    scan, unrolled = _pair(Layered(), (x, h))
    assert _note(scan, "is one scan of 5 iterations (each of 2 calls)"), scan.program.notes
    assert scan.validation["status"] == "passed"
    assert len(_looped(scan)) == 2
    assert scan.totals["flops"] == unrolled.totals["flops"]
