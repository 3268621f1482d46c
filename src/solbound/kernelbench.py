"""``solbound kernelbench``: the KernelBench runner (PyTorch programs), kept importable
here; it lives in ``frontends/torch/kernelbench.py``."""

from .frontends.torch.kernelbench import *  # noqa: F401,F403
from .frontends.torch.kernelbench import (list_problems, read_csv, run_cli,  # noqa: F401
                                          stale_problems, summary, timings_date)
