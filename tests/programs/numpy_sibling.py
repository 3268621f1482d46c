"""example() with numpy inputs, but the function comes from a sibling module (which may
hold a JAX or PyTorch model): not a numpy program."""

import numpy as np
from numpy_layer_model import apply  # noqa: F401 - a sibling module


def example():
    return apply, (np.ones((2, 2), np.float32),)
