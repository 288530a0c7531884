"""Where independent pieces of work run: this process, a pool of worker processes, or a Ray cluster.

- :mod:`ccoverlap.workers.pool` — the engine interface (``map(fn, items)``), the serial and the
  local-process engines, and :func:`~ccoverlap.workers.pool.make_engine` for ``--engine``;
- :mod:`ccoverlap.workers.ray_cluster` — the same interface on a Ray cluster's workers.

``analyze`` maps its per-rank work over an engine, ``plan --search`` its candidate layouts.
"""
