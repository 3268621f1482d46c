"""Running many independent analyses on Ray: each item is one Ray task, on a local
instance started inside the command (nothing to set up) or on an existing cluster.

One item's failure is one outcome, never the end of the run:

* the function raises: ``error`` with its one-line message (type, text, file:line);
* its worker process dies (a crash, ``os._exit``, the OOM killer, Ray's memory
  monitor): ``died``, and Ray starts a fresh worker for the next item;
* it runs past the time limit: ``timeout``. The limit is measured from the moment the
  item starts in its worker (a timer there interrupts it, and the worker is reused), so
  a worker's start-up does not count against it; an item stuck where the timer cannot
  interrupt it (inside one long native call) has its worker killed by the driver
  (``ray.cancel(force=True)``) once twice the limit plus a grace for start-up has
  passed since it was submitted;
* it allocates past the memory limit: the address-space limit set around the call
  makes the allocation fail inside the function, so that is an ``error`` naming the
  limit.

At most as many items are in flight as the engine has CPUs, so an item starts as soon as
its worker is ready. Tasks are never retried
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


#: the driver's backstop for an item the worker's timer cannot interrupt: twice the
#: limit plus this many seconds after submission (a cold worker imports torch first)
START_GRACE = 30.0


class _PointTimeout(BaseException):
    """Raised in a worker by its timer (a BaseException: no ``except Exception`` in the
    analyzed program or in solbound turns it into an ordinary error)."""


def _timer(seconds: float | None):
    """Arm a ``SIGALRM`` timer in this (main) thread that raises :class:`_PointTimeout`;
    returns the function that disarms it, or None where no timer can be set."""
    import signal
    import threading
    if not seconds or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        return None

    def ring(signum, frame):
        raise _PointTimeout()
    try:
        old = signal.signal(signal.SIGALRM, ring)
    except (ValueError, OSError):
        return None
    signal.setitimer(signal.ITIMER_REAL, float(seconds))

    def disarm():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return disarm


def _warm() -> None:
    """Import solbound's analysis stack (torch with it) before a time limit is armed: a
    fresh worker's first import takes seconds under load, and an import the timer
    interrupted would leave a module half initialized for the worker's next items."""
    try:
        import solbound.api  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        pass


def _drop_orphans() -> None:
    """After the timer interrupted an item: Python forgets a module whose import was cut
    short, but keeps the submodules it had imported, which would make the package's next
    import in this worker fail half way ("partially initialized module"); forget those
    too, so the worker's next item imports the package anew. (solbound's own stack and
    torch are imported before the timer is armed: :func:`_warm`.)"""
    import sys
    for name in list(sys.modules):
        parts = name.split(".")
        if any(".".join(parts[:k]) not in sys.modules for k in range(1, len(parts))):
            sys.modules.pop(name, None)


def call_limited(fn: Callable, item, memory_limit: int | None, time_limit: float | None = None):
    """``fn(item)`` in a worker: ``("ok", value)``, ``("error", line)`` or
    ``("timeout", line)``. With a memory limit, the process's address space may grow by at
    most that many bytes during the call (``RLIMIT_AS``); with a time limit, a timer
    interrupts the call after that many seconds of its own run. Both are undone
    afterwards: the worker is reused."""
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
    disarm = None
    try:
        if time_limit:
            _warm()
        disarm = _timer(time_limit)
        return "ok", fn(item)
    except _PointTimeout:
        _drop_orphans()
        return "timeout", f"over the time limit of {time_limit:g} s (interrupted)"
    except MemoryError as e:
        return "error", (f"over the memory limit of {memory_limit / 2**30:.3g} GiB "
                         f"({one_line(e)})" if memory_limit else one_line(e))
    except BaseException as e:  # noqa: BLE001 - one item's failure is one outcome
        line = one_line(e)
        if restore and ("allocate" in line or "memory" in line.lower()):
            line = f"over the memory limit of {memory_limit / 2**30:.3g} GiB ({line})"
        return "error", line
    finally:
        if disarm:
            disarm()
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
                 memory_limit: int | None = None, grace: float = START_GRACE):
        self.jobs, self.address, self.working_dir = jobs, address, working_dir
        self.timeout, self.memory_limit, self.grace = timeout, memory_limit, grace
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
                ref = remote.remote(fn, item, self.memory_limit, self.timeout)
                running[ref] = (i, time.perf_counter(), False)
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.1)
            now = time.perf_counter()
            for ref in done:
                i, t0, cancelled = running.pop(ref)
                try:
                    kind, payload = ray.get(ref, timeout=5)
                    yield Outcome(i, "ok", value=payload, seconds=now - t0) if kind == "ok" \
                        else Outcome(i, kind, error=payload, seconds=now - t0)
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
                    if not cancelled and now - t0 > 2 * self.timeout + self.grace:
                        ray.cancel(ref, force=True)
                        running[ref] = (i, t0, True)

