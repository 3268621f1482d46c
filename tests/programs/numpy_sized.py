"""A numpy program sized by a module-level constant (the agent's reduced-shape check)."""

import numpy as np

N = 64


def scale_rows(x):
    return x * 2.0


def example():
    return scale_rows, (np.random.default_rng(0).standard_normal((N, N)).astype(np.float32),)
