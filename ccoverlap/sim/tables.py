"""Static tables of an :class:`~ccoverlap.sim.graph.OpGraph` for the stream simulator
(:mod:`ccoverlap.sim.simulator`): per-op columns, streams as small integers with their queues, interned
specs, dependency counts and dependents, and the two successor tables the event loop's spans
follow. Built with comprehensions and numpy (no per-op Python statements), once per
simulation; the event loop only reads them (and counts ``waiting_deps`` down)."""

from __future__ import annotations

import itertools
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np


class SimTables(NamedTuple):
    """Per op (indexed by op id): ``names``, ``op_rank`` (and ``rank_arr``, the same as int64),
    ``stream_names``, ``op_stream`` (stream id, in first-use order of (rank, stream)),
    ``op_pos`` (position in its stream's queue), ``op_spec`` (index into ``specs``, the specs
    interned by value; -1 without a spec), ``fixed`` (a duration override in seconds, 0 for an
    op without a spec, else None: ask the cost model), ``waiting_deps`` (dependencies not yet
    met), ``dependents`` (ops waiting for it), ``simple`` and ``link`` (see
    :func:`static_tables`). Per stream: ``stream_rank``, ``queues`` (op ids in issue order)."""

    names: list
    op_rank: list
    rank_arr: np.ndarray
    stream_names: list
    op_stream: list
    stream_rank: list
    op_pos: list
    queues: list
    specs: list
    op_spec: list
    fixed: list
    waiting_deps: list
    dependents: list
    simple: list
    link: list


def static_tables(ops: list) -> SimTables:
    """The tables of the ops ``ops`` (non-empty, ids 0..n-1 in order). ``simple[i]``: the op
    that surely starts, alone, when i ends (i's only dependent, waiting on i only, next on i's
    stream), else -1; ``link[i]``: i's only dependent, waiting on i only, on another stream of
    i's rank (it starts when i ends if it heads its stream then), else -1."""
    n = len(ops)
    names, op_rank, stream_names, spec_objs, durations_given, n_deps, flat_deps = _columns(ops)
    rank_arr = np.fromiter(op_rank, dtype=np.int64, count=n)
    sarr, pos, stream_rank, queues = _streams(rank_arr, stream_names)
    specs, op_spec, fixed = _interned_specs(spec_objs, durations_given)
    wd = np.array(n_deps, dtype=np.int64)
    src = np.array(flat_deps, dtype=np.int64)
    dst = np.repeat(np.arange(n), wd)
    by_src = np.argsort(src, kind="stable")
    dst_sorted = dst[by_src]
    dst_l = dst_sorted.tolist()
    n_dependents = np.bincount(src, minlength=n)
    ptr_a = np.concatenate(([0], np.cumsum(n_dependents)))
    ptr = ptr_a.tolist()
    dependents = [dst_l[a:b] for a, b in zip(ptr[:-1], ptr[1:])]
    # simple[i]: the op that surely starts, alone, when i ends (i's only dependent, waiting on
    # i only, next on i's stream), else -1
    one = n_dependents == 1
    cand = np.where(one, dst_sorted[np.minimum(ptr_a[:-1], max(len(dst_sorted) - 1, 0))] if len(dst_sorted)
                    else 0, 0)
    single = one & (wd[cand] == 1)
    simple = np.where(single & (sarr[cand] == sarr) & (pos[cand] == pos + 1), cand, -1).tolist()
    # link[i]: i's only dependent, waiting on i only, on another stream of i's rank (it starts
    # when i ends if it heads its stream then), else -1
    link = np.where(single & (sarr[cand] != sarr) & (rank_arr[cand] == rank_arr), cand, -1).tolist()
    return SimTables(names, op_rank, rank_arr, stream_names, sarr.tolist(), stream_rank, pos.tolist(), queues, specs,
                     op_spec, fixed, wd.tolist(), dependents, simple, link)


def _columns(ops: list) -> tuple[list, list, list, list, list, list[int], list[int]]:
    """The ops' names, ranks, stream names, specs, duration overrides, dependency counts and
    flattened dependency ids (in op order)."""
    n = len(ops)
    # the six columns needed (one itemgetter pass each is cheaper than transposing all ten),
    # taken a block of ops at a time: 10^5 records do not fit in the CPU's caches, a block
    # does, so the six passes read each record from memory once (half the time of six whole
    # passes); the deps' counts and flattened ids taken in the same block
    cols: list[list[Any]] = [[] for _ in range(6)]
    names, op_rank, stream_names, spec_objs, deps_of, durations_given = cols
    getters = [itemgetter(k) for k in range(1, 7)]
    n_deps: list[int] = []
    flat_deps: list[int] = []
    for b in range(0, n, 2048):
        block = ops[b:b + 2048]
        for col, get in zip(cols, getters):
            col.extend(map(get, block))
        block = deps_of[b:b + 2048]
        n_deps.extend(map(len, block))
        flat_deps.extend(itertools.chain.from_iterable(block))
    return names, op_rank, stream_names, spec_objs, durations_given, n_deps, flat_deps


def _streams(rank_arr: np.ndarray, stream_names: list) -> tuple[np.ndarray, np.ndarray, list, list]:
    """Streams as integer ids in first-use order of (rank, stream): (stream id per op,
    position per op in its stream's queue, rank per stream, queue of op ids per stream).

    One stable sort of the (rank, stream) keys groups each stream's ops in issue order; the
    keys are small integers (a radix sort where they fit 16 bits), and each group's first
    op gives its first use."""
    n = len(stream_names)
    name_code = {s: c for c, s in enumerate(dict.fromkeys(stream_names))}
    key = rank_arr * len(name_code) + np.fromiter(map(name_code.__getitem__, stream_names), dtype=np.int64,
                                                  count=n)
    if key.min() < 0 or key.max() >= 2 * n + (1 << 16):  # sparse or negative ranks: number the keys densely
        key = np.unique(key, return_inverse=True)[1].reshape(-1)
    n_keys = int(key.max()) + 1
    order = np.argsort(key.astype(np.uint16) if n_keys <= 1 << 16 else key, kind="stable")
    count_k = np.bincount(key, minlength=n_keys)
    first_k = np.concatenate(([0], np.cumsum(count_k)[:-1]))  # each key's first slot in ``order``
    present = np.flatnonzero(count_k)
    first_use = order[first_k[present]]  # each present key's first op
    by_first_use = np.argsort(first_use, kind="stable")
    keys = present[by_first_use]  # the key of each stream id
    renumber = np.empty(n_keys, dtype=np.int64)
    renumber[keys] = np.arange(len(keys))
    sarr = renumber[key]
    stream_rank = rank_arr[first_use[by_first_use]].tolist()
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n) - np.repeat(first_k, count_k)
    order_l = order.tolist()
    queues = [order_l[a:a + c] for a, c in zip(first_k[keys].tolist(), count_k[keys].tolist())]
    return sarr, pos, stream_rank, queues


def _interned_specs(spec_objs: list, durations_given: list) -> tuple[list, list[int], list]:
    """(specs interned by value, index of each op's spec or -1 without one, each op's
    duration override in seconds: 0 without a spec, None to ask the cost model). Ops stamped
    from one template share one spec object, so objects are looked at once each."""
    spec_ids = list(map(id, spec_objs))
    spec_of_value: dict = {}
    specs: list = []
    index_of_id: dict[int, int] = {id(None): -1}
    for obj in dict(zip(spec_ids, spec_objs)).values():
        if obj is not None:
            si = spec_of_value.get(obj)
            if si is None:
                si = spec_of_value[obj] = len(specs)
                specs.append(obj)
            index_of_id[id(obj)] = si
    op_spec = list(map(index_of_id.__getitem__, spec_ids))  # -1 without a spec
    # indexed by spec index, -1 (no spec) picking the last entry
    fixed = list(map(([None] * len(specs) + [0.0]).__getitem__, op_spec))
    if durations_given.count(None) != len(spec_objs):
        for i, d in enumerate(durations_given):
            if d is not None:
                fixed[i] = d
    return specs, op_spec, fixed
