"""The agent frontend against a real OpenAI-compatible HTTP server on 127.0.0.1 that
replays scripted replies (``llm_server.py``): no network, no model, exact counts."""

import json
import os

import pytest

from llm_server import ScriptedLLM
from solbound.api import analyze_source
from solbound.cli import main
from solbound.frontends.agent import prompt
from solbound.frontends.agent.endpoint import AgentError, Endpoint
from solbound.frontends.agent.translate import Agent
from solbound.frontends.contract import FrontendError
from solbound.ir.model import SCALAR_OPS
from solbound.ir.text import parse_program, print_program

HERE = os.path.dirname(__file__)
EXAMPLES = os.path.join(HERE, "..", "examples", "agent")
NUMPY = os.path.join(EXAMPLES, "numpy_layer.py")
CUSTOM = os.path.join(EXAMPLES, "custom_op.py")
JAXCB = os.path.join(EXAMPLES, "jax_callback.py")

LAYER = """# solbound IR v1
x = input(f32[4, 8])
w = input(f32[8, 16])
h = intermediate(f32[4, 16])
out0 = output(f32[4, 16])
out1 = output(f32[4])

@kernel(i=4, j=16, k=8)
def mm():
    h[i, j] = sum(x[i, k] * w[k, j])

@kernel(i=4, j=16)
def relu_scale():
    out0[i, j] = maximum(h[i, j], 0.0) * SCALE

@kernel(i=4, j=16)
def rowsum():
    out1[i] = sum(maximum(h[i, j], 0.0))
"""
RIGHT = "Here it is:\n```\n" + LAYER.replace("SCALE", "0.5") + "```\n"
WRONG = "```python\n" + LAYER.replace("SCALE", "0.25") + "```"

RMS = """```
# solbound IR v1
x = input(f32[4, 16])
w = input(f32[16])
ss = intermediate(f32[4])
out = output(f32[4, 16])

@kernel(i=4, j=16)
def sumsq():
    ss[i] = sum(x[i, j] * x[i, j])

@kernel(i=4, j=16)
def scale():
    out[i, j] = x[i, j] * rsqrt(ss[i] / 16.0 + 1e-06) * w[j]
```"""


def _agent(srv, tmp_path, rounds=6, timeout=30.0, retries=2, model="test-model"):
    ep = Endpoint(model, base_url=srv.url, api_key="unused", timeout=timeout,
                  max_retries=retries)
    return Agent(rounds=rounds, cache_dir=str(tmp_path / "cache"), endpoint=ep, say=None)


def test_wrong_then_right_carries_the_feedback_and_counts_exactly(tmp_path):
    with ScriptedLLM([WRONG, RIGHT]) as srv:
        agent = _agent(srv, tmp_path)
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=agent)
    tr = rep.agent["translations"][0]
    assert tr["accepted"] and tr["attempts"] == 2 and not tr["cached"]
    assert tr["feedback"][0]["stage"] == "mismatch"
    assert "output out0 (written by kernel relu_scale) diverges" in tr["feedback"][0]["feedback"]
    # the second request holds the whole conversation: system, task, reply 1, feedback 1
    second = srv.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == WRONG
    assert tr["feedback"][0]["feedback"] in second[3]["content"]
    # counts: x[4,8] @ w[8,16] on the matrix unit; relu and scale, relu and the row sum
    c = rep.counts
    assert c.macs == 4 * 8 * 16
    assert c.flops == {"matrix": 2 * 4 * 8 * 16, "vector": 2 * 64 + 2 * 64, "special": 0}
    assert c.fused.bytes == 4 * (4 * 8 + 8 * 16 + 4 * 16 + 4)
    assert rep.validation["status"] == "passed"
    assert json.loads(rep.to_json())["agent"]["model"] == "test-model"


def test_hostile_replies_are_refused_with_their_line_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    hostile = [
        f"```\nimport os\nos.system('touch {marker}')\n```",
        "```\n" + LAYER.replace("SCALE", f"exec(\"open('{marker}', 'w')\")") + "```",
        "```\n" + LAYER.replace("SCALE", "x.__class__") + "```",
        "```\n" + LAYER.replace("@kernel(i=4, j=16, k=8)",
                                f"@__import__('os').system('touch {marker}')") + "```",
        RIGHT]
    with ScriptedLLM(hostile) as srv:
        agent = _agent(srv, tmp_path)
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=agent)
    fb = rep.agent["translations"][0]["feedback"]
    assert [f["stage"] for f in fb] == ["parse"] * 4
    assert "line 1" in fb[0]["feedback"] and "Import" in fb[0]["feedback"]
    assert "line 14" in fb[1]["feedback"] and "exec" in fb[1]["feedback"]
    assert "line 14" in fb[2]["feedback"]
    assert "line 8" in fb[3]["feedback"]
    assert not marker.exists()
    assert rep.agent["translations"][0]["accepted"]


def test_malformed_replies(tmp_path):
    script = ["I cannot write IR.", {"content": "```\n# solbound IR v1\nx = input(f32[4",
                                     "finish": "length"}, RIGHT]
    with ScriptedLLM(script) as srv:
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))
    fb = [f["feedback"] for f in rep.agent["translations"][0]["feedback"]]
    assert "no fenced code block" in fb[0]
    assert "truncated" in fb[1]


def test_the_interface_is_checked(tmp_path):
    extra = RIGHT.replace("h = intermediate", "z = parameter(f32[3])\nh = intermediate")
    renamed = RIGHT.replace("out1", "total")
    with ScriptedLLM([extra, renamed, RIGHT]) as srv:
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))
    fb = [f["feedback"] for f in rep.agent["translations"][0]["feedback"]]
    assert "declares parameter z" in fb[0]
    assert "no output out1 = output(f32[4])" in fb[1]


def test_the_endpoint_failing_is_retried(tmp_path):
    script = [{"status": 500, "retry_after_ms": 1}, {"status": 429, "retry_after_ms": 1},
              {"sleep": 1.5, "content": RIGHT}, RIGHT]
    with ScriptedLLM(script) as srv:
        agent = _agent(srv, tmp_path, timeout=0.5, retries=3)
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=agent)
    assert rep.agent["translations"][0]["attempts"] == 1
    assert len(srv.requests) == 4       # 500, 429, a timeout, then the reply


def test_an_endpoint_that_keeps_failing_is_one_line(tmp_path):
    with ScriptedLLM([{"status": 503, "retry_after_ms": 1}] * 3) as srv:
        with pytest.raises(AgentError, match=r"answered HTTP 503 \(after retries\)"):
            analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))


def test_rounds_run_out_on_a_whole_program(tmp_path):
    with ScriptedLLM([WRONG, WRONG]) as srv:
        with pytest.raises(FrontendError, match="did not validate in 2 attempt"):
            analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path, rounds=2))


def test_a_rerun_is_served_by_the_cache(tmp_path):
    with ScriptedLLM([RIGHT]) as srv:
        analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))
    with ScriptedLLM([]) as srv:
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))
        assert srv.requests == []
    tr = rep.agent["translations"][0]
    assert tr["cached"] and tr["accepted"] and rep.agent["requests"] == 0
    assert rep.counts.macs == 512


def test_a_stale_cache_entry_is_translated_anew(tmp_path):
    with ScriptedLLM([RIGHT]) as srv:
        agent = _agent(srv, tmp_path)
        analyze_source(NUMPY, arch="h100-sxm", agent=agent)
    (path,) = (tmp_path / "cache").iterdir()
    rec = json.loads(path.read_text())
    rec["ir"] = rec["ir"].replace("* 0.5", "* 0.75")
    path.write_text(json.dumps(rec))
    with ScriptedLLM([RIGHT]) as srv:
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))
        assert len(srv.requests) == 1
    assert not rep.agent["translations"][0]["cached"]


def test_a_custom_op_is_translated_and_spliced(tmp_path):
    with ScriptedLLM([WRONG, RMS]) as srv:
        agent = _agent(srv, tmp_path)
        rep = analyze_source(CUSTOM, arch="h100-sxm", agent=agent, validate=True)
    assert not rep.unsupported
    tr = rep.agent["translations"][0]
    assert tr["target"] == "solbound_test.rms_scale" and tr["accepted"]
    assert tr["feedback"][0]["stage"] == "interface"
    # the operator's code and this call's shapes are in the prompt
    first = srv.requests[0]["messages"][1]["content"]
    assert "x_np / (rms + eps) ** 0.5" in first and "x = input(f32[4, 16])" in first
    assert "eps=1e-06" in first
    # linear 4x16x16 plus the fragment's sum of squares (4x16), exactly
    assert rep.counts.macs == 4 * 16 * 16 + 4 * 16
    # x, the rms weight, the linear's weight and bias, the output: once each
    assert rep.counts.fused.bytes == 4 * (64 + 16 + 256 + 16 + 64)
    assert rep.validation["status"] == "passed"
    k = next(k.name for k in rep.program.kernels if "sumsq" in k.name)
    assert "origin      written by the agent (test-model) for solbound_test.rms_scale" \
        in rep.explain(k)


def test_an_operator_that_never_validates_stays_unsupported(tmp_path):
    with ScriptedLLM([WRONG, WRONG]) as srv:
        rep = analyze_source(CUSTOM, arch="h100-sxm", agent=_agent(srv, tmp_path, rounds=2))
    (u,) = rep.unsupported
    assert u.operator == "solbound_test.rms_scale"
    assert "the agent's IR did not validate" in u.reason
    d = json.loads(rep.to_json())
    tr = d["agent"]["translations"][0]
    assert not tr["accepted"] and tr["attempts"] == 2 and len(tr["feedback"]) == 2
    assert rep.counts.macs == 4 * 16 * 16        # the linear alone: the rest is not counted


def test_a_jax_callback_is_translated_and_spliced(tmp_path):
    softplus = """```
# solbound IR v1
x0 = input(f32[4, 16])
out = output(f32[4, 16])

@kernel(i=4, j=16)
def softplus():
    out[i, j] = log1p(exp(x0[i, j]))
```"""
    with ScriptedLLM([softplus]) as srv:
        rep = analyze_source(JAXCB, arch="h100-sxm", agent=_agent(srv, tmp_path), validate=True)
    assert not rep.unsupported
    assert rep.counts.macs == 4 * 8 * 16
    assert rep.counts.fused.bytes == 4 * (4 * 8 + 8 * 16 + 4 * 16)
    assert rep.validation["status"] == "passed"
    assert "def host_softplus" in srv.requests[0]["messages"][1]["content"]


def test_the_command_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "prog.ir"
    with ScriptedLLM([RIGHT]) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.url)
        monkeypatch.setenv("OPENAI_API_KEY", "unused")
        monkeypatch.setenv("SOLBOUND_LLM_MODEL", "test-model")
        args = ["--agent-cache", str(tmp_path / "cache")]
        assert main(["translate", NUMPY, "-o", str(out)] + args) == 0
        assert parse_program(out.read_text()).tensor_map["out1"].shape == (4,)
        capsys.readouterr()
        # the rerun: from the cache, the JSON report carries the agent block
        assert main(["analyze", NUMPY, "--agent", "--arch", "h100-sxm", "--json", "-"]
                    + args) == 0
        cap = capsys.readouterr()
        assert json.loads(cap.out)["agent"]["translations"][0]["cached"]
        assert "from the cache (no request)" in cap.err
        assert len(srv.requests) == 1
        # an unknown model is one line
        assert main(["analyze", NUMPY, "--agent", "--llm-model", "nope"]
                    + ["--agent-cache", str(tmp_path / "other")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("solbound: error: the LLM endpoint") and "no model 'nope'" in err[-1]
    # an endpoint that cannot be reached is one line
    monkeypatch.setenv("OPENAI_BASE_URL", srv.url)        # the server is gone
    assert main(["analyze", NUMPY, "--agent", "--agent-cache", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "cannot reach the LLM endpoint" in err[-1]


def test_a_numpy_program_without_the_agent_is_one_line(capsys):
    assert main(["analyze", NUMPY]) == 2
    err = capsys.readouterr().err
    assert "read by the agent frontend only: add --agent" in err


def test_the_prompt_is_built_from_the_grammar_tables():
    from solbound.ir.model import INFIX, PREFIX
    text = prompt.grammar()
    import re
    ops = text.split("Scalar operations: ", 1)[1].split("; conversions", 1)[0]
    for op, (arity, _) in SCALAR_OPS.items():
        if op.startswith("to_") or op in ("operands", "rand"):
            continue
        spelled = (f"a {INFIX[op]} b" if op in INFIX else f"{PREFIX[op]}a" if op in PREFIX
                   else "a ** b" if op == "pow" else f"{op}({', '.join('abc'[:arity])})")
        assert re.search(r"(^|, )" + re.escape(spelled) + r"(,|$)", ops), op
    assert "a // b" in text and "~a" in text and "a ** b" in text
    assert "cumsum" in text and "argmax" in text and "searchsorted" in text


def test_the_worked_examples_are_what_solbound_ir_prints():
    for name in prompt.EXAMPLES:
        rep = analyze_source(os.path.join(prompt.HERE, name + ".py"), arch="h100-sxm")
        with open(os.path.join(prompt.HERE, name + ".ir")) as f:
            assert print_program(rep.program) == f.read(), name


def test_over_the_budget_stops_at_once(tmp_path):
    with ScriptedLLM([RIGHT, RIGHT]) as srv:
        agent = _agent(srv, tmp_path)
        agent.max_bytes = 1000                 # the program's own arrays need more
        with pytest.raises(FrontendError, match="over the validation budget"):
            analyze_source(NUMPY, arch="h100-sxm", agent=agent)
        assert len(srv.requests) == 1


def test_replies_that_would_crash_or_exhaust_are_feedback(tmp_path):
    huge = RIGHT.replace("h = intermediate(f32[4, 16])",
                         "h = intermediate(f32[4, 16])\nbig = intermediate(f32[1000000, 1000000])")
    nodim = RIGHT.replace("@kernel(i=4, j=16)\ndef relu_scale():\n    out0[i, j] = maximum(h[i, j], 0.0) * 0.5",
                          "@kernel(i=4, j=16, a=4, b=16)\n@library(name=\"sort\")\n"
                          "def relu_scale():\n    out0[i, j] = h[a, b]")     # a sort with no dim
    badlib = RIGHT.replace("@kernel(i=4, j=16)\ndef rowsum():",
                           "@kernel(i=4, j=16)\n@library(name=[1])\ndef rowsum():")
    with ScriptedLLM([huge, nodim, badlib, RIGHT]) as srv:
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=_agent(srv, tmp_path))
    fb = rep.agent["translations"][0]["feedback"]
    assert [f["stage"] for f in fb] == ["budget", "parse", "parse"]
    assert "declares 7450" in fb[0]["feedback"] or "GiB of tensors" in fb[0]["feedback"]
    assert "the IR cannot be analyzed: KeyError" in fb[1]["feedback"]
    assert "unknown library routine [1]" in fb[2]["feedback"]
    assert rep.agent["translations"][0]["accepted"]


def test_a_triton_kernel_is_translated_and_run_in_tritons_interpreter(tmp_path):
    pytest.importorskip("triton")
    ir = """```
# solbound IR v1
x = input(f32[8, 32])
y = input(f32[8, 32])
out = output(f32[8, 32])

@kernel(i=8, j=32)
def fma_():
    out[i, j] = x[i, j] * y[i, j] + x[i, j]
```"""
    wrong = ir.replace("+ x[i, j]", "+ y[i, j]")
    with ScriptedLLM([wrong, ir]) as srv:
        rep = analyze_source(os.path.join(EXAMPLES, "triton_op.py"), arch="h100-sxm",
                             agent=_agent(srv, tmp_path), validate=True)
    assert not rep.unsupported and rep.validation["status"] == "passed"
    first = srv.requests[0]["messages"][1]["content"]
    assert "the Triton kernel it launches" in first and "tl.store(out_ptr" in first
    tr = rep.agent["translations"][0]
    assert tr["attempts"] == 2 and tr["feedback"][0]["stage"] == "mismatch"
    # x*y + x (a multiply and an add) and the * 2.0 outside, per element; x, y, out once
    assert rep.counts.flops["vector"] == 3 * 8 * 32
    assert rep.counts.fused.bytes == 3 * 4 * 8 * 32


def test_the_registry_tells_numpy_from_jax():
    from solbound.frontends.loading import import_file
    from solbound.frontends.registry import for_object, for_source
    assert for_source(NUMPY).name == "numpy"
    assert for_source(JAXCB).name == "jax"
    assert for_source(CUSTOM).name == "torch"
    assert for_source(os.path.join(HERE, "..", "examples", "jax_mlp.py")).name == "jax"
    # a file importing its model from a sibling module is not a numpy program
    sib = os.path.join(HERE, "programs", "numpy_sibling.py")
    assert for_source(sib).name == "jax"
    fn, args = import_file(NUMPY).example()
    assert for_object(fn, args).name == "numpy"
    jfn, jargs = import_file(JAXCB).example()
    assert for_object(jfn, jargs).name == "jax"


def test_over_the_time_budget_the_same_ir_is_checked_on_a_slice(tmp_path):
    """The full-size IR itself, its outputs computed on their first rows only (producers
    confined by the demand pass): a wrong IR still fails, a right one passes, partially."""
    with ScriptedLLM([WRONG, RIGHT]) as srv:
        agent = _agent(srv, tmp_path)
        agent.max_seconds = 3e-7          # the whole IR is estimated at ~4e-7 s
        rep = analyze_source(NUMPY, arch="h100-sxm", agent=agent)
    tr = rep.agent["translations"][0]
    assert tr["attempts"] == 2 and tr["feedback"][0]["stage"] == "mismatch"
    assert "first 1/2 of its rows" in rep.validation["partial"]
    assert rep.counts.macs == 4 * 8 * 16          # the counts are the whole IR's


def test_over_the_memory_budget_the_slice_holds_only_its_rows(tmp_path):
    """A whole numpy program whose 64 x 64 intermediate is over the memory budget (its
    inputs and outputs are not): the same full-size IR, its output's first quarter of rows
    computed, the intermediate held as those 16 rows; a wrong IR still fails."""
    from test_demand import DENSITY
    right = "```\n" + DENSITY + "```"
    wrong = right.replace("exp(0.0 - d2[i, j])", "exp(0.0 - 0.5 * d2[i, j])")
    with ScriptedLLM([wrong, right]) as srv:
        agent = _agent(srv, tmp_path)
        # the validation's estimate (validate.compare.estimate_cost): the tensors x 5/4 and
        # two more copies of the input: (1,024 + 16,384 + 256) x 5/4 + 2 x 1,024 = 24,128 B;
        # half the rows (1,024 + 8,192 + 256) x 5/4 + 2,048 = 13,888 B; a quarter 8,768 B
        agent.max_bytes = 12_000
        rep = analyze_source(os.path.join(HERE, "programs", "numpy_density.py"),
                             arch="h100-sxm", agent=agent)
    tr = rep.agent["translations"][0]
    assert tr["attempts"] == 2 and tr["feedback"][0]["stage"] == "mismatch"
    assert "first 1/4 of its rows" in rep.validation["partial"]
    assert "intermediates held as that region" in rep.validation["partial"]
    assert rep.counts.macs == 64 * 64 * 4           # the whole IR's counts


def test_sliced_confines_producers_to_the_rows_read():
    from solbound.analysis.counts import count_program
    from solbound.frontends.agent.translate import sliced
    from solbound.graph.einsum import build_graph
    p = parse_program(LAYER.replace("SCALE", "0.5"))
    q = sliced(p, {"out0", "out1"}, 2)
    assert count_program(build_graph(q)).macs == 2 * 8 * 16      # rows 0..1 of h
    assert sliced(p, {"out0", "out1"}, 4) is not None
