"""Pipeline schedules as pure functions of per-stage times: closed forms."""

import pytest

from solbound.schedules.pipeline import (ScheduleError, Stage, closed_form_bubble,
                                         simulate)


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (8, 16), (3, 7), (8, 64)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_closed_form(schedule, p, m):
    """Equal stages, no transfers: the makespan is (m + p - 1)(F + B + W) and the bubble
    (p - 1) / (m + p - 1)."""
    f, b, w = 1.5, 2.0, 1.25
    r = simulate(schedule, [Stage(f, b, w)] * p, m)
    assert r.makespan == pytest.approx((m + p - 1) * (f + b + w))
    assert r.bubble_fraction == pytest.approx(closed_form_bubble(p, m))
    assert sum(r.busy) == pytest.approx(p * m * (f + b + w))


def test_memory_under_each_schedule():
    """Microbatches holding activations: GPipe all of them, 1F1B p - s on stage s."""
    assert simulate("gpipe", [Stage(1, 1, 1)] * 4, 6).peak_inflight == [6] * 4
    assert simulate("1f1b", [Stage(1, 1, 1)] * 4, 6).peak_inflight == [4, 3, 2, 1]
    assert simulate("1f1b", [Stage(1, 1, 1)] * 4, 2).peak_inflight == [2, 2, 2, 1]


@pytest.mark.parametrize("f,b,w", [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 0.5)])
@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (2, 3), (8, 64)])
def test_zero_bubble(f, b, w, p, m):
    """W deferred into the bubbles: never above ZB-H1's m (F + B + W) + (p - 1)(F + B - W)
    (Qi et al. 2024, equal stages), equal to it at F = B = W, and never below the busiest
    stage's work plus the first forward's and last backward's chains."""
    r = simulate("zb", [Stage(f, b, w)] * p, m)
    zb_h1 = m * (f + b + w) + (p - 1) * (f + b - w)
    assert r.makespan <= zb_h1 + 1e-9
    if f == b == w:
        assert r.makespan == pytest.approx(zb_h1)
    assert r.makespan >= m * (f + b + w) + (p - 1) * (f + b) / 2 - 1e-9 or p == 1


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 4), (2, 6, 3)])
def test_interleaved_bubble(p, m, v):
    """Megatron's interleaved 1F1B: the warm-up and cool-down shrink by the chunks,
    m (F + B) + (p - 1)(F + B) / v."""
    r = simulate("interleaved", [Stage(1.0, 1.5, 0.5)] * p, m, chunks=v)
    assert r.makespan == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)


def test_transfers_and_unequal_stages():
    """One microbatch over two stages: F0, send, F1, B1+W1, send, B0+W0; the slowest stage
    sets the steady state."""
    r = simulate("1f1b", [Stage(1, 1, 1), Stage(1, 1, 1)], 1, p2p=0.25)
    assert r.makespan == pytest.approx(1 + 0.25 + 1 + 2 + 0.25 + 2)
    slow = simulate("1f1b", [Stage(1, 1, 0), Stage(3, 3, 0)], 50)
    assert slow.makespan == pytest.approx(50 * 6 + 1 + 1)


def test_bad_schedules_are_one_line():
    with pytest.raises(ScheduleError, match="unknown schedule 'dualpipe'"):
        simulate("dualpipe", [Stage(1, 1, 1)] * 2, 4)
    with pytest.raises(ScheduleError, match="not a multiple of the 4 stages"):
        simulate("interleaved", [Stage(1, 1, 1)] * 4, 6, chunks=2)
    with pytest.raises(ScheduleError, match="at least 2 chunks"):
        simulate("interleaved", [Stage(1, 1, 1)] * 4, 8)
