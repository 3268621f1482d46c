"""Lowering rules, one small function per ATen operator (registered on import)."""

from . import views, elementwise, reduce, linalg, int4pack, norm, pool, misc, recurrent, scatter, library, backward, collectives, control, flex  # noqa: F401,E501
