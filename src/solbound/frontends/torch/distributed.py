"""A per-rank program traced without processes or GPUs: a fake process group.

``fake_world(n)`` initializes ``torch.distributed`` with PyTorch's ``fake`` backend
(``torch.testing._internal.distributed.fake_pg``): this process is rank 0 of ``n``, every
collective returns at once and moves nothing, and ``dist.get_world_size()``,
``init_device_mesh`` and DTensor see ``n`` ranks. The program a model builds for rank 0
(its shards, its collectives) is then traced like any other; the collectives become IR
kernels (``rules/collectives.py``). Nothing is allocated: the model stays on the meta
device.

>>> with fake_world(4):
...     import torch.distributed as dist
...     dist.get_world_size(), dist.get_rank()
(4, 0)
"""

from __future__ import annotations

import contextlib


class WorldError(ValueError):
    pass


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0):
    """Rank ``rank`` of ``world_size`` under a fake process group, for the duration."""
    import torch.distributed as dist
    if not isinstance(world_size, int) or world_size < 1:
        raise WorldError(f"--world-size {world_size!r}: expected a positive integer")
    if dist.is_initialized():
        have = dist.get_world_size()
        if have != world_size:
            raise WorldError(f"--world-size {world_size}: a process group of {have} ranks is "
                             f"already initialized")
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def world_size() -> int:
    """The size of the initialized world, or 1."""
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
