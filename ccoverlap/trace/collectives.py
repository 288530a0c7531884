"""Per-collective statistics: count, bytes, time, algorithm and bus bandwidth.

Grouped by (collective type, process group) over the analysed rows of every rank.
Bandwidths follow nccl-tests (doc/PERFORMANCE.md): ``algbw = size / time`` with ``size`` the
larger of the input and output buffers, ``busbw = algbw × factor`` with factor 2(n−1)/n for
all_reduce, (n−1)/n for all_gather / reduce_scatter / all_to_all, 1 for broadcast / reduce
(and for point-to-point), ``n`` the group size. The factor comes from
:func:`ccoverlap.cost.comm.bus_bandwidth_factor`, the cost model's own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

_P2P = ("send", "recv", "p2p")


def busbw_factor(collective: str, n: int) -> float | None:
    """nccl-tests' busbw/algbw factor for ``collective`` over ``n`` ranks (None: not defined).

    The same table as :func:`ccoverlap.cost.comm.bus_bandwidth_factor` (nccl-tests
    doc/PERFORMANCE.md; a test checks they agree), kept here so that ``ccoverlap analyze`` does
    not import the cost model at start-up; point-to-point is 1.
    """
    if n < 1:
        return None
    if collective in _P2P:
        return 1.0
    return {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}.get(collective)


@dataclass
class CollectiveStats:
    """One (collective, group) line. Times in seconds, sizes in bytes, bandwidths in bytes/s.

    ``algbw`` / ``busbw`` are time-weighted (total bytes / total time) over the calls with a
    known size; ``ranks`` is how many ranks ran it; ``exposed_s`` is the part of its time
    during which no compute ran on the same rank (summed over ranks).
    """

    collective: str
    group: str
    group_size: int
    count: int
    ranks: int
    bytes_total: float
    bytes_mean: float
    time_total_s: float
    time_mean_s: float
    time_max_s: float
    algbw: float | None
    busbw: float | None
    exposed_s: float = 0.0

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        return asdict(self)


def pooled_collective_stats(parts: list[tuple]) -> list[CollectiveStats]:
    """:class:`CollectiveStats` from each rank's analysed communication rows: ``(rank, timeline of
    those rows, their group sizes, their exposed seconds)`` per rank, in rank order."""
    colls, groups, sizes, nbytes, durs, ranks, exposed = [], [], [], [], [], [], []
    for rank, tl, gsize, ex in parts:
        colls.append(tl.collective)
        groups.append(tl.group)
        sizes.append(gsize)
        nbytes.append(tl.bytes)
        durs.append(tl.end_s - tl.start_s)
        ranks.append(np.full(len(tl), rank))
        exposed.append(ex)
    if not colls:
        return []
    coll = np.concatenate(colls)
    grp = np.concatenate(groups)
    size = np.concatenate(sizes)
    b = np.concatenate(nbytes)
    d = np.concatenate(durs)
    rk = np.concatenate(ranks)
    ex = np.concatenate(exposed)
    out: list[CollectiveStats] = []
    keys = sorted({(str(c) or "unknown", str(g)) for c, g in zip(coll, grp)})
    for c, g in keys:
        m = (coll == c) & (grp == g) if c != "unknown" else ((coll == c) | (coll == "")) & (grp == g)
        n = int(m.sum())
        if n == 0:
            continue
        gsize = int(np.max(size[m])) if n else 0
        known = m & (b > 0)
        t_known = float(d[known].sum())
        algbw = float(b[known].sum() / t_known) if t_known > 0 else None
        f = busbw_factor(c, gsize) if gsize else None
        out.append(CollectiveStats(
            collective=c, group=g, group_size=gsize, count=n, ranks=len(np.unique(rk[m])),
            bytes_total=float(b[m].sum()), bytes_mean=float(b[m].mean()),
            time_total_s=float(d[m].sum()), time_mean_s=float(d[m].mean()), time_max_s=float(d[m].max()),
            algbw=algbw, busbw=algbw * f if (algbw is not None and f is not None) else None,
            exposed_s=float(ex[m].sum()),
        ))
    out.sort(key=lambda s: -s.time_total_s)
    return out
