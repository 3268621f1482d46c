"""Running many independent analyses on Ray: each item is one Ray task, on a local
instance started inside the command (nothing to set up) or on an existing cluster.

One item's failure is one outcome, never the end of the run:

* the function raises: ``error`` with its one-line message (type, text, file:line);
* its worker process dies (a crash, ``os._exit``, the OOM killer, Ray's memory
  monitor): ``died``, and Ray starts a fresh worker for the next item;
* it runs past the time limit: its worker is killed (``ray.cancel(force=True)``),
  ``timeout``;
* it allocates past the memory limit: the address-space limit set around the call
  makes the allocation fail inside the function, so that is an ``error`` naming the
  limit.

At most as many items are in flight as the engine has CPUs, so an item starts as soon as
it is submitted and its time limit is measured from then. Tasks are never retried
(``max_retries=0``): a deterministic analysis that failed once fails again.

>>> Outcome(0, "error", error="ValueError: bad").failed
True
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator


class EngineError(Exception):
    """The engine cannot start or reach its cluster (one line for the user)."""


@dataclass
class Outcome:
    index: int
    status: str                 # ok | error | died | timeout
    value: Any = None
    error: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status != "ok"


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message (file:line)``, the innermost frame."""
    from ..frontends.loading import oneline, where
    return f"{oneline(exc)} ({where(exc)})" if exc.__traceback__ else oneline(exc)


def _vm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def call_limited(fn: Callable, item, memory_limit: int | None):
    """``fn(item)`` in a worker: ``("ok", value)`` or ``("error", line)``. With a memory
    limit, the process's address space may grow by at most that many bytes during the
    call (``RLIMIT_AS``; restored afterwards, the worker is reused)."""
    import warnings
    warnings.filterwarnings("ignore")
    restore = None
    if memory_limit:
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            base = _vm_bytes()
            if base is not None:
                cap = base + int(memory_limit)
                if hard != resource.RLIM_INFINITY:
                    cap = min(cap, hard)
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
                restore = (soft, hard)
        except (ImportError, ValueError, OSError):
            restore = None
    try:
        return "ok", fn(item)
    except MemoryError as e:
        return "error", (f"over the memory limit of {memory_limit / 2**30:.3g} GiB "
                         f"({one_line(e)})" if memory_limit else one_line(e))
    except BaseException as e:  # noqa: BLE001 - one item's failure is one outcome
        line = one_line(e)
        if restore and ("allocate" in line or "memory" in line.lower()):
            line = f"over the memory limit of {memory_limit / 2**30:.3g} GiB ({line})"
        return "error", line
    finally:
        if restore:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, restore)


def _probe(address: str, timeout: float = 5.0) -> None:
    """A cluster address must accept a TCP connection within ``timeout`` seconds (Ray's
    own connect retries for minutes on an address where nothing listens)."""
    import socket
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise EngineError(f"--address {address!r}: expected auto, HOST:PORT or "
                          f"ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise EngineError(f"cannot reach the Ray cluster at {address!r}: {host}:{port}: "
                          f"{e.strerror or e}") from None


class Engine:
    """A Ray instance for the duration of a ``with`` block.

    ``address``: None starts a local instance with ``jobs`` CPUs (default: all of this
    machine's); ``"auto"`` or ``"ray://HOST:PORT"`` (or a GCS ``HOST:PORT``) joins an
    existing cluster, shipping ``working_dir`` (the program's folder) and solbound itself
    to its workers."""

    def __init__(self, jobs: int | None = None, address: str | None = None,
                 working_dir: str | None = None, timeout: float | None = None,
                 memory_limit: int | None = None):
        self.jobs, self.address, self.working_dir = jobs, address, working_dir
        self.timeout, self.memory_limit = timeout, memory_limit
        self.slots = 1
        self._started = False

    @property
    def name(self) -> str:
        return "ray-local" if self.address is None else f"ray@{self.address}"

    def __enter__(self) -> "Engine":
        try:
            import ray
        except ImportError:
            raise EngineError("the sweep engine needs Ray: pip install 'solbound[sweep]'") \
                from None
        if ray.is_initialized():
            ray.shutdown()
        # the driver prints the cluster's error messages (a dead worker's, a paragraph) to
        # stdout, which --json - owns; the engine reports each in its item's outcome
        try:
            import ray._private.worker as _rw
            _rw.print_to_stdstream = lambda data, ignore_prefix=False: None
        except (ImportError, AttributeError):
            pass
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        if self.address not in (None, "auto"):
            _probe(self.address)
        kwargs: dict = {"include_dashboard": False, "log_to_driver": False,
                        "configure_logging": False}
        try:
            if self.address is None:
                ncpu = self.jobs or os.cpu_count() or 1
                # the object store holds only small rows: the least Ray allows
                ray.init(num_cpus=ncpu, object_store_memory=80 * 2**20, **kwargs)
            else:
                # the solbound package (this file's grandparent folder) ships to the workers
                pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                env: dict = {"py_modules": [pkg]}
                if self.working_dir:
                    env["working_dir"] = self.working_dir
                ray.init(address=self.address, runtime_env=env, **kwargs)
        except Exception as e:  # noqa: BLE001 - an unreachable cluster is one line
            msg = str(e).strip().splitlines()
            where = "a local Ray instance" if self.address is None else \
                f"the Ray cluster at {self.address!r}"
            raise EngineError(f"cannot start or reach {where}: {type(e).__name__}: "
                              f"{msg[0] if msg else ''}") from None
        self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = max(1, min(cpus, self.jobs) if self.jobs else cpus)
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            import ray
            ray.shutdown()
            self._started = False

    def map(self, fn: Callable, items: Iterable) -> Iterator[Outcome]:
        """``fn(item)`` for each item, as Ray tasks; outcomes in completion order."""
        import ray
        from ray.exceptions import (GetTimeoutError, OutOfMemoryError, RayError,
                                    TaskCancelledError, WorkerCrashedError)
        remote = ray.remote(call_limited).options(max_retries=0, num_cpus=1)
        pending = list(enumerate(items))
        pending.reverse()
        running: dict = {}            # ref -> (index, start, cancelled)
        while pending or running:
            while pending and len(running) < self.slots:
                i, item = pending.pop()
                ref = remote.remote(fn, item, self.memory_limit)
                running[ref] = (i, time.perf_counter(), False)
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.1)
            now = time.perf_counter()
            for ref in done:
                i, t0, cancelled = running.pop(ref)
                try:
                    kind, payload = ray.get(ref, timeout=5)
                    yield Outcome(i, "ok", value=payload, seconds=now - t0) if kind == "ok" \
                        else Outcome(i, "error", error=payload, seconds=now - t0)
                except TaskCancelledError:
                    yield Outcome(i, "timeout", seconds=now - t0,
                                  error=f"over the time limit of {self.timeout:g} s (its "
                                        f"worker was stopped)")
                except OutOfMemoryError:
                    yield Outcome(i, "died", seconds=now - t0,
                                  error="its worker was killed by Ray's memory monitor (the "
                                        "machine ran low on memory)")
                except WorkerCrashedError:
                    if cancelled:
                        yield Outcome(i, "timeout", seconds=now - t0,
                                      error=f"over the time limit of {self.timeout:g} s (its "
                                            f"worker was stopped)")
                    else:
                        yield Outcome(i, "died", seconds=now - t0,
                                      error="its worker process died (a crash, os._exit or "
                                            "the OOM killer)")
                except (GetTimeoutError, RayError) as e:
                    yield Outcome(i, "died", seconds=now - t0,
                                  error=f"the engine lost the task: {one_line(e)}")
            if self.timeout:
                for ref, (i, t0, cancelled) in list(running.items()):
                    if not cancelled and now - t0 > self.timeout:
                        ray.cancel(ref, force=True)
                        running[ref] = (i, t0, True)

