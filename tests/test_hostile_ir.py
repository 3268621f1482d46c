"""Untrusted IR text: everything outside the subset is refused before anything runs.

Each payload would create a marker file if any part of it were executed; the
parser must refuse it with a line-numbered error and the marker must not exist.
"""

import os

import pytest

from solbound.ir.text import IRSyntaxError, parse_program

HEAD = "x = input(f32[4])\ny = output(f32[4])\n"
K = "@kernel(i=4)\ndef k():\n    y[i] = {}\n"


def payload(marker):
    return f"__import__('os').system('touch {marker}')"


CASES = [
    # (name, text-template with {cmd} for a side-effecting expression, expected line)
    ("import", "import os\n" + HEAD, 1),
    ("from-import", HEAD + "from os import system\n", 3),
    ("top-level-call", HEAD + "{cmd}\n", 3),
    ("exec", HEAD + "exec('{q}')\n", 3),
    ("eval", HEAD + "eval('1')\n", 3),
    ("assign-call", HEAD + "z = {cmd}\n", 3),
    ("body-call", HEAD + K.format("{cmd}"), 5),
    ("body-attribute", HEAD + K.format("x.__class__"), 5),
    ("body-dunder-name", HEAD + K.format("__builtins__"), 5),
    ("body-lambda", HEAD + K.format("(lambda: 1)()"), 5),
    ("body-listcomp", HEAD + K.format("[a for a in range(3)]"), 5),
    ("body-genexp", HEAD + K.format("sum(a for a in x)"), 5),
    ("body-walrus", HEAD + K.format("(z := x[i])"), 5),
    ("body-fstring", HEAD + K.format("f'{{x}}'"), 5),
    ("body-string", HEAD + K.format("'abc'"), 5),
    ("body-subscript-call", HEAD + K.format("x[{cmd}]"), 5),
    ("body-open", HEAD + K.format("open('/etc/passwd')"), 5),
    ("body-getattr", HEAD + K.format("getattr(x, 'y')"), 5),
    ("body-await", HEAD + "@kernel(i=4)\nasync def k():\n    y[i] = x[i]\n",4),
    ("decorator-call", HEAD + "@kernel(i={cmd})\ndef k():\n    y[i] = x[i]\n", 3),
    ("decorator-other", HEAD + "@staticmethod\n@kernel(i=4)\ndef k():\n    y[i] = x[i]\n", 3),
    ("decorator-attr", HEAD + "@os.system\ndef k():\n    y[i] = x[i]\n", 3),
    ("default-arg", HEAD + "@kernel(i=4)\ndef k(a={cmd}):\n    y[i] = x[i]\n", 4),
    ("annotation", HEAD + "@kernel(i=4)\ndef k() -> {cmd}:\n    y[i] = x[i]\n", 4),
    ("two-statements", HEAD + "@kernel(i=4)\ndef k():\n    {cmd}\n    y[i] = x[i]\n", 4),
    ("loop-undeclared-dim", HEAD + K.format("x[j]"), 5),
    ("for-loop-body", HEAD + "for i in range(4):\n    pass\n", 4),
    ("for-loop-iter-call", HEAD + "for i in {cmd}:\n    pass\n", 3),
    ("for-loop-range-expr", HEAD + "for i in range(len('abc')):\n    pass\n", 3),
    ("for-loop-else", HEAD + "for i in range(2):\n    pass\nelse:\n    pass\n", 3),
    ("while", HEAD + "while True:\n    pass\n", 3),
    ("class", HEAD + "class A:\n    pass\n", 3),
    ("with", HEAD + "with open('f') as f:\n    pass\n", 3),
    ("try", HEAD + "try:\n    pass\nexcept Exception:\n    pass\n", 3),
    ("global", HEAD + "global x\n", 3),
    ("delete", HEAD + "del x\n", 3),
    ("augassign", HEAD + "x += 1\n", 3),
    ("starred-kwargs", HEAD + "@kernel(**{{'i': 4}})\ndef k():\n    y[i] = x[i]\n", 3),
    ("role-call", "x = input({cmd})\n", 1),
    ("dtype-attribute", "x = input(os.f32[4])\n", 1),
    ("shape-expression", "x = input(f32[{cmd}])\n", 1),
    ("note-expression", HEAD + "note({cmd})\n", 3),
    ("origin-non-string", HEAD + "@kernel(i=4)\n@origin(op={cmd})\ndef k():\n    y[i] = x[i]\n", 4),
    ("reduce-keyword", HEAD + "@kernel(i=4)\ndef k():\n    y[i] = sum(x[i], key={cmd})\n", 5),
    ("guard-call", HEAD + "@kernel(i=4)\ndef k():\n    y[i] = x[i] if {cmd} else 0.0\n", 5),
    ("else-call", HEAD + "@kernel(i=4)\ndef k():\n    y[i] = x[i] if (0 <= i < 4) else {cmd}\n", 5),
    ("indirect-call", HEAD + K.format("x[x[{cmd}]]"), 5),
    ("dunder-kernel-name", HEAD + "@kernel(i=4)\ndef __init__():\n    y[i] = x[i]\n",4),
    ("dunder-tensor-name", "__class__ = input(f32[4])\n", 1),
    ("nested-def", HEAD + "@kernel(i=4)\ndef k():\n    def g():\n        pass\n",4),
    ("return", HEAD + "@kernel(i=4)\ndef k():\n    return {cmd}\n",4),
    ("yield", HEAD + "@kernel(i=4)\ndef k():\n    yield 1\n",4),
    ("deep-nesting", HEAD + K.format("(" * 400 + "x[i]" + ")" * 400), 0),
]


@pytest.mark.parametrize("name,template,line", CASES, ids=[c[0] for c in CASES])
def test_hostile_text_is_refused_and_never_runs(tmp_path, name, template, line):
    marker = tmp_path / "executed"
    text = template.format(cmd=payload(marker), q=f"open('{marker}', 'w')")
    with pytest.raises(IRSyntaxError) as ei:
        parse_program(text)
    assert not marker.exists()
    if line:
        assert ei.value.line == line, str(ei.value)
    assert str(ei.value)


def test_at_least_thirty_hostile_inputs():
    assert len(CASES) >= 30


def test_string_constants_in_origin_are_inert(tmp_path):
    marker = tmp_path / "executed"
    text = HEAD + f'@kernel(i=4)\n@origin(src="{payload(marker)}")\ndef k():\n    y[i] = x[i]\n'
    p = parse_program(text)
    assert p.kernels[0].src.startswith("__import__") and not marker.exists()
    assert not os.path.exists(marker)
