"""An engine (:mod:`ccoverlap.workers.pool`) that runs the work on a Ray cluster's workers.

``ccoverlap analyze --engine ray [--address ADDR]`` and ``ccoverlap plan --search --engine ray``
use it: each item becomes one Ray task (one CPU), sent to whichever worker of the cluster is
free, and the results come back to the driver in item order. For ``analyze`` an item is a trace
file's path or URL and the task's result is that rank's small
:class:`~ccoverlap.trace.summary.RankSummary`: the worker streams the file itself (from a shared
file system or an object store through fsspec, :mod:`ccoverlap.trace.sources`), so the driver
holds summaries only and combines them (:mod:`ccoverlap.trace.combine`) exactly as a local run.

Ray (``pip install 'ccoverlap[ray]'``) is imported only by this module, which only
:func:`ccoverlap.workers.pool.make_engine` imports, only for ``--engine ray``. Every node of the
cluster needs the same ccoverlap installed.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

from ccoverlap.errors import CCOverlapError, ConfigError

#: tasks in flight per CPU of the cluster: enough to keep every worker busy while the driver
#: collects results in order, few enough that pending results stay a small multiple of the CPUs
IN_FLIGHT_PER_CPU = 2


def _ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray: pip install 'ccoverlap[ray]'") from None
    return ray


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """One line instead of Ray's retries when nothing listens at ``host:port``."""
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return   # 'auto', 'local' and other forms Ray resolves itself
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConfigError(f"--address {address}: no Ray cluster reachable there ({exc.strerror or exc})") from None


def connect(address: str | None = None) -> ModuleType:
    """The ``ray`` module, connected: to ``address`` (``host:port`` of the head node, ``auto`` for
    the cluster running on this machine, ``ray://host:10001`` for Ray Client), or to a Ray
    instance started on this machine when ``address`` is None. An existing connection is reused."""
    ray = _ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address:
        _check_reachable(address)
        kwargs["address"] = address
    else:
        kwargs["include_dashboard"] = False
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"at {address}" if address else "on this machine"
        raise ConfigError(f"cannot connect to a Ray cluster {where}: {str(exc).splitlines()[0][:200]}") from None
    return ray


class RayEngine:
    """Runs ``map`` on a Ray cluster (see the module docstring); ``jobs`` is the cluster's CPUs."""

    def __init__(self, address: str | None = None) -> None:
        self._ray = connect(address)
        self.jobs = max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable, items: Iterable) -> Iterator:
        """``fn(item)`` for each item as one Ray task; results in item order, at most
        :data:`IN_FLIGHT_PER_CPU` tasks per CPU in flight."""
        ray = self._ray
        task = ray.remote(num_cpus=1)(fn)
        limit = IN_FLIGHT_PER_CPU * self.jobs
        pending: deque = deque()
        for item in items:
            pending.append(task.remote(item))
            if len(pending) >= limit:
                yield self._get(pending.popleft())
        while pending:
            yield self._get(pending.popleft())

    def _get(self, ref: Any) -> Any:
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CCOverlapError(f"a Ray task failed ({type(exc).__name__}: {first[:300]})") from None
