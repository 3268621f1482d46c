"""Serving: the speed of light of an inference engine's steps and workloads.

An engine step is a batch of sequences, each with ``new`` tokens and ``ctx`` cached
tokens (``step.py``: :class:`StepModel`, built once per model from its own code and cache
classes, then a bound per composition in well under a millisecond); what the model's cache
really keeps (``capacity.py``); lower bounds on a workload's makespan, throughput, TTFT and
TPOT under an engine's limits (``workload.py``); measured runs of vLLM and SGLang divided by
them (``measured.py``). The design is in ``docs/architecture.md`` ("Serving") and the
arguments in ``docs/serving.md``.
"""

from .step import Seq, StepError, StepModel, parse_seqs  # noqa: F401
