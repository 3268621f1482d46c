"""Published timings flagged when a problem changed after they were taken (a KernelBench-
shaped git repository made here, with problems written for this test)."""

import json
import os
import subprocess

from solbound.kernelbench import list_problems, stale_problems, summary, timings_date

PROBLEM = '''import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, a):
        return a {op} 2
def get_inputs():
    return [torch.randn(8, 8)]
def get_init_inputs():
    return []
'''


def _commit(repo, msg, date):
    env = dict(os.environ, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date, GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", msg], cwd=repo, check=True, env=env)


def test_problems_edited_after_the_timings_are_flagged_and_excluded(tmp_path):
    repo = tmp_path / "kb"
    lv = repo / "KernelBench" / "level1"
    tim = repo / "results" / "timing" / "H100"
    lv.mkdir(parents=True)
    tim.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (lv / "1_Scale.py").write_text(PROBLEM.format(op="*"))
    (lv / "2_Shift.py").write_text(PROBLEM.format(op="+"))
    _commit(repo, "problems", "2025-07-01T00:00:00+00:00")
    data = {"level1": {"1_Scale.py": {"mean": 1.0}, "2_Shift.py": {"mean": 1.0}}}
    (tim / "baseline_time_torch.json").write_text(json.dumps(data))
    _commit(repo, "timings", "2025-12-31T00:00:00+00:00")
    (lv / "2_Shift.py").write_text(PROBLEM.format(op="-"))
    _commit(repo, "edit problem 2", "2026-01-19T00:00:00+00:00")

    # a copy of the timings elsewhere (no history) is matched to the checkout's file
    copy = tmp_path / "timings"
    copy.mkdir()
    (copy / "baseline_time_torch.json").write_text(json.dumps(data))
    since = timings_date(str(copy), str(repo / "KernelBench"))
    assert since.startswith("2025-12-31")
    problems = list_problems(str(repo / "KernelBench"), [1])
    stale = stale_problems(problems, since)
    assert [os.path.basename(p) for p in stale] == ["2_Shift.py"]
    assert "edit problem 2" in next(iter(stale.values()))

    rows = [{"level": "1", "name": "1_Scale.py", "status": "ok", "headroom_eager": "2.0",
             "bytes_fused": "1", "bytes_unfused": "1", "timing_stale": ""},
            {"level": "1", "name": "2_Shift.py", "status": "ok", "headroom_eager": "0.5",
             "bytes_fused": "1", "bytes_unfused": "1", "timing_stale": stale[problems[1][2]]}]
    table = summary(rows)
    line = [x for x in table.splitlines() if x.startswith("| 1 |")][0]
    # the stale row's headroom (0.5, a "bound above measured") is left out of the aggregates
    assert line.split("|")[6].strip() == "2" and line.split("|")[-2].strip() == "0"
    assert "Excluded from the headroom columns" in table and "2_Shift.py" in table
