"""Schedules beside the bounds: pure functions from per-stage times to a step's makespan
(``pipeline.py``: GPipe, 1F1B, interleaved 1F1B, zero bubble)."""
