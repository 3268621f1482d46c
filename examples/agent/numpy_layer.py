"""A program no tracer reads: numpy only. The agent frontend translates it."""

import numpy as np


def layer(x, w, scale):
    h = np.maximum(x @ w, 0.0)
    return h * scale, h.sum(axis=1)


def example():
    rng = np.random.default_rng(0)
    return layer, (rng.standard_normal((4, 8)).astype(np.float32),
                   rng.standard_normal((8, 16)).astype(np.float32), 0.5)
