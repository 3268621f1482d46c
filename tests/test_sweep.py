"""``solbound sweep`` and ``analyze --param`` (solbound/sweep/): the grid, the rows, the
engine's failures (a raising point, a dying worker, a timeout), --resume, and KernelBench
scheduled on the same engine. The tests that start Ray share one xdist worker: one local
instance at a time on this machine."""

import csv
import json
import os
import textwrap

import pytest

from solbound.cli import main
from solbound.sweep.run import COLUMNS
from solbound.sweep.spec import SweepError, load, parse

ray_group = pytest.mark.xdist_group("ray")

PROGRAM = textwrap.dedent('''
    import os
    import time
    import torch
    import torch.nn as nn


    def mlp(batch=4, width=32):
        return nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(),
                             nn.Linear(2 * width, width)), (torch.randn(batch, width),)


    def flaky(batch=1, width=32):
        if batch == 2:
            raise ValueError("batch 2 is refused")
        if batch == 3:
            os._exit(7)                 # the worker process dies
        if batch == 5:
            time.sleep(120)             # past the time limit
        if batch == 6:
            return bytearray(64 << 30)  # past the memory limit
        return mlp(batch, width)
''')


def _write(folder, grid="batch = [1, 8]\nwidth = [16, 32]", program="prog:mlp", extra=""):
    (folder / "prog.py").write_text(PROGRAM)
    path = folder / "sweep.toml"
    path.write_text(f'program = "{program}"\narch = ["h100-sxm", "b200"]\n'
                    f'modes = ["unfused", "fused"]\n{extra}\n[grid]\n{grid}\n')
    return str(path)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _macs(batch, width):
    # two linears: batch x width x 2*width multiply-adds each
    return 2 * batch * width * 2 * width


def test_the_grid_is_every_combination_first_parameter_slowest(tmp_path):
    s = load(_write(tmp_path))
    assert s.points() == [{"batch": 1, "width": 16}, {"batch": 1, "width": 32},
                          {"batch": 8, "width": 16}, {"batch": 8, "width": 32}]
    assert s.modes == ["unfused", "fused"] and s.archs == ["h100-sxm", "b200"]


@pytest.mark.parametrize("data, message", [
    ({"program": "p:f", "arch": ["h100-sxm"], "grids": {}}, "unknown key 'grids'"),
    ({"arch": ["h100-sxm"]}, "'program' is required"),
    ({"program": "p:f", "arch": ["nochip"]}, "arch 'nochip' is not a chip"),
    ({"program": "p:f", "arch": "h100-sxm", "grid": {"b": []}}, "grid.b is an empty list"),
    ({"program": "p:f", "arch": "h100-sxm", "grid": {"b": [[1]]}}, "is not an int"),
    ({"program": "p:f", "arch": "h100-sxm", "modes": ["fastest"]}, "'fastest' is not a fidelity"),
    ({"program": "p:f", "arch": "h100-sxm", "world_size": 0}, "world_size 0: a positive"),
    ({"program": "p:f", "arch": "h100-sxm", "grid": {"tp": [2, 0]}}, "grid.tp: 0 is not"),
    ({"program": "p:f", "arch": "h100-sxm", "grid": {"status": [1]}}, "also an output column"),
    ({"program": "p:f", "arch": "h100-sxm", "timeout": -1}, "'timeout' must be a positive"),
])
def test_a_bad_sweep_file_is_one_line_naming_the_key(data, message):
    with pytest.raises(SweepError, match=message):
        parse(data, "s.toml")


def test_bad_input_stops_before_any_point_runs(tmp_path, capsys):
    # a parameter the factory does not take: named, before Ray starts (exit 2, no CSV rows)
    path = _write(tmp_path, grid="batch = [1]\ndepth = [2]")
    out = tmp_path / "out.csv"
    assert main(["sweep", path, "--csv", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the factory takes no parameter 'depth' (it takes batch, width)" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    # a file's parameters are its module-level names
    kb = tmp_path / "kb.py"
    kb.write_text("import torch\nN = 4\nclass Model(torch.nn.Module):\n"
                  "    def forward(self, x):\n        return x * 2\n"
                  "def get_inputs():\n    return [torch.randn(N)]\n"
                  "def get_init_inputs():\n    return []\n")
    (tmp_path / "f.toml").write_text('program = "kb.py"\narch = "h100-sxm"\n[grid]\nM = [1]\n')
    assert main(["sweep", str(tmp_path / "f.toml"), "--csv", str(out)]) == 2
    assert "parameter 'M' is not a module-level name" in capsys.readouterr().err
    # an unknown key
    (tmp_path / "k.toml").write_text('program = "kb.py"\narch = "h100-sxm"\nnodes = 3\n')
    assert main(["sweep", str(tmp_path / "k.toml"), "--csv", str(out)]) == 2
    assert "unknown key 'nodes'" in capsys.readouterr().err


def test_an_unreachable_cluster_is_one_line(tmp_path, capsys):
    path = _write(tmp_path, grid="batch = [1]")
    assert main(["sweep", path, "--csv", str(tmp_path / "o.csv"),
                 "--address", "ray://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("solbound: error: cannot reach the Ray cluster at "
                              "'ray://127.0.0.1:1'")


def test_analyze_param_passes_keyword_arguments_and_module_constants(tmp_path, capsys,
                                                                    monkeypatch):
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "prog:mlp", "--param", "batch=3", "--param", "width=8",
                 "--arch", "h100-sxm", "--json", "-", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["macs"] == _macs(3, 8)
    kb = tmp_path / "kb.py"
    kb.write_text("import torch\nN = 4\nclass Model(torch.nn.Module):\n"
                  "    def forward(self, x):\n        return x @ x.T\n"
                  "def get_inputs():\n    return [torch.randn(N, 8)]\n"
                  "def get_init_inputs():\n    return []\n")
    assert main(["analyze", str(kb), "--param", "N=6", "--arch", "h100-sxm",
                 "--json", "-", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["macs"] == 6 * 6 * 8
    assert main(["analyze", "prog:mlp", "--param", "depth=2", "--arch", "h100-sxm"]) == 2
    assert "takes no parameter 'depth'" in capsys.readouterr().err


@ray_group
def test_a_sweep_on_local_ray_survives_raising_dying_and_slow_points(tmp_path, capsys,
                                                                    monkeypatch):
    path = _write(tmp_path, grid="batch = [1, 2, 3, 4, 5, 6]", program="prog:flaky",
                  extra="timeout = 15\nmemory = 4")
    out, js, page = tmp_path / "out.csv", tmp_path / "out.json", tmp_path / "out.html"
    assert main(["sweep", path, "--csv", str(out), "--json", str(js), "--html", str(page),
                 "--jobs", "2"]) == 0
    rows = _rows(out)
    with open(out, newline="") as f:
        assert next(csv.reader(f)) == ["batch"] + COLUMNS
    # one row per point, chip and asked fidelity, in point order
    assert [(r["batch"], r["arch"], r["mode"]) for r in rows] == [
        (str(b), a, m) for b in range(1, 7) for a in ("h100-sxm", "b200")
        for m in ("unfused", "fused")]
    status = {r["batch"]: (r["status"], r["error"]) for r in rows}
    assert status["1"] == ("ok", "") and status["4"] == ("ok", "")
    assert status["2"][0] == "error" and "ValueError: batch 2 is refused" in status["2"][1]
    assert status["3"][0] == "died" and "worker process died" in status["3"][1]
    # measured from the point's own start in its worker, which the timer interrupts
    assert status["5"] == ("timeout", "over the time limit of 15 s (interrupted)")
    assert status["6"][0] == "error" and "over the memory limit of 4 GiB" in status["6"][1]
    assert {r["engine"] for r in rows} == {"ray-local"}
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(int(r["macs"]) == _macs(int(r["batch"]), 32) for r in ok)
    err = capsys.readouterr().err
    assert "[6/6" in err and "failed 4, left 0" in err

    # a sweep row equals the single `analyze --param` run of its point
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "prog:mlp", "--param", "batch=4", "--arch", "h100-sxm,b200",
                 "--json", "-", "-q"]) == 0
    rep = json.loads(capsys.readouterr().out)
    for b in rep["bounds"]:
        if b["mode"] not in ("unfused", "fused"):
            continue
        row = next(r for r in ok if r["batch"] == "4" and r["arch"] == b["arch"]
                   and r["mode"] == b["mode"])
        assert float(row["seconds"]) == b["seconds"] and int(row["bytes"]) == b["bytes"]
        assert int(row["macs"]) == rep["totals"]["macs"]

    # --resume: points already in the output are not run again (the engine does not start)
    assert main(["sweep", path, "--csv", str(out), "--resume"]) == 0
    assert "6 of 6 point(s) already in the output, 0 to run" in capsys.readouterr().err
    assert _rows(out) == rows
    # ... and a point missing from it is (its rows come back in point order)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["batch"] + COLUMNS)
        w.writeheader()
        w.writerows(r for r in rows if r["batch"] != "4")
    assert main(["sweep", path, "--csv", str(out), "--resume", "--jobs", "1"]) == 0
    assert "5 of 6 point(s) already in the output, 1 to run" in capsys.readouterr().err
    again = _rows(out)
    assert [(r["batch"], r["arch"], r["mode"]) for r in again] == \
        [(r["batch"], r["arch"], r["mode"]) for r in rows]
    assert [r for r in again if r["batch"] == "4"] == [r for r in rows if r["batch"] == "4"]

    html = page.read_text()
    assert "Speed of light against batch" in html and "plotly" in html
    assert "Every point on the roofline of h100-sxm" in html and "Failed points" in html
    assert "batch=3: died" in html

    data = json.loads(js.read_text())
    assert data["parameters"] == ["batch"] and len(data["rows"]) == len(rows)
    assert all(r["flops"] > 0 for r in data["rows"] if r["status"] == "ok")


def _tiny_kernelbench(root):
    lv = root / "level1"
    lv.mkdir(parents=True)
    body = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n"
            "        return {expr}\nN = {n}\ndef get_inputs():\n"
            "    return [torch.randn(N, N), torch.randn(N, N)]\n"
            "def get_init_inputs():\n    return []\n")
    (lv / "1_Matmul.py").write_text(body.format(expr="a @ b", n=16))
    (lv / "2_Add.py").write_text(body.format(expr="torch.relu(a + b)", n=32))
    (lv / "3_Broken.py").write_text(body.format(expr="a @ b", n=8).replace(
        "N = 8", "N = 8\nraise RuntimeError('this problem does not import')"))
    (lv / "4_Dies.py").write_text(body.format(expr="a * b", n=8).replace(
        "N = 8", "N = 8\nimport os\nos._exit(3)"))


@ray_group
def test_a_task_the_timer_cannot_interrupt_has_its_worker_stopped():
    """A task that blocks the worker's timer (as one long native call would) is stopped by
    the driver once twice the limit plus the grace has passed; the next task runs."""
    from solbound.sweep.engine import Engine

    def work(x):
        import signal
        import time
        if x == "stuck":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(120)
        return x
    with Engine(jobs=2, timeout=1, grace=10) as eng:    # grace: a cold worker's imports
        got = sorted((o.index, o.status, o.error, o.value) for o in eng.map(work, ["stuck", "ok"]))
    assert got[0][:3] == (0, "timeout", "over the time limit of 1 s (its worker was stopped)")
    assert got[1] == (1, "ok", "", "ok")


@pytest.mark.slow          # 25 s; the engine's failures are the sweep test's, above
@ray_group
def test_kernelbench_on_the_engine_writes_the_serial_runs_csv(tmp_path, capsys):
    _tiny_kernelbench(tmp_path / "KernelBench")
    root = str(tmp_path / "KernelBench")
    one, two = tmp_path / "serial.csv", tmp_path / "jobs2.csv"
    assert main(["kernelbench", root, "--levels", "1", "--jobs", "1", "--csv", str(one)]) == 0
    assert main(["kernelbench", root, "--levels", "1", "--jobs", "2", "--csv", str(two)]) == 0
    a, b = _rows(one), _rows(two)
    assert [r["name"] for r in a] == ["1_Matmul.py", "2_Add.py", "3_Broken.py", "4_Dies.py"]
    for r, s in zip(a, b):
        assert {k: v for k, v in r.items() if k != "seconds"} == \
            {k: v for k, v in s.items() if k != "seconds"}
    assert a[0]["status"] == "ok" and int(a[0]["macs"]) == 16 ** 3
    assert a[1]["status"] == "ok" and int(a[1]["macs"]) == 0
    assert a[2]["status"] == "error" and "this problem does not import" in a[2]["error"]
    assert a[3]["status"] == "error" and "worker process died" in a[3]["error"]
    assert "4 problems in" in capsys.readouterr().out


@pytest.mark.slow
@ray_group
def test_a_sweep_on_a_running_cluster_ships_the_programs_folder(tmp_path, monkeypatch):
    """``ray start --head`` (a cluster of one node), then ``--address auto`` from another
    folder: the program's module comes to the workers with the sweep's working_dir."""
    import subprocess
    path = _write(tmp_path, grid="batch = [1, 2]")
    env = {**os.environ, "RAY_ADDRESS": ""}
    subprocess.run(["ray", "start", "--head", "--num-cpus", "2", "--include-dashboard=false"],
                   check=True, capture_output=True, env=env)
    try:
        monkeypatch.chdir("/")
        out = tmp_path / "out.csv"
        assert main(["sweep", path, "--csv", str(out), "--address", "auto"]) == 0
        rows = _rows(out)
        assert {r["engine"] for r in rows} == {"ray@auto"}
        assert all(r["status"] == "ok" for r in rows)
        assert [int(r["macs"]) for r in rows if r["arch"] == "b200" and r["mode"] == "fused"] \
            == [_macs(1, 32), _macs(2, 32)]
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True)
