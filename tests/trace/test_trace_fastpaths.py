"""The column-wise fast paths of the analyser give what the plain per-value code gives.

* :func:`ccoverlap.trace.result.round12` (vectorised 12-significant-digit rounding) against
  ``float(f"{v:.12g}")`` on random values of every magnitude and on the hard cases (ties,
  powers of ten, values that round up to the next power, zeros, non-finite);
* ``write_json``'s ``comm_kernels`` rows, written as text column by column, against
  ``json.dumps(to_dict(), indent=2)``;
* the factorisations of the kernel kinds and the (device, stream) pairs against ``np.unique``;
* the contention medians (one rank's, and pooled over ranks for all kernels at once) against
  ``np.median``.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
from trace_synth import kernel, nccl, trace, write

from ccoverlap.trace.analyze import analyze
from ccoverlap.trace.classify import _factorize, _factorize_pairs
from ccoverlap.trace.report_json import write_json
from ccoverlap.trace.result import json_ready, round12


def _reference(v: float):
    return float(f"{v:.12g}") if math.isfinite(v) else None


def test_round12_equals_the_text_rounding_on_random_values():
    rng = np.random.default_rng(7)
    mant = rng.random(200_000) * 10
    exps = rng.integers(-40, 40, size=mant.size).astype(float)
    values = np.concatenate([mant * 10.0 ** exps, -mant[:1000] * 10.0 ** exps[:1000],
                             rng.integers(0, 1 << 53, size=20_000).astype(float)])
    got = round12(values)
    want = [_reference(v) for v in values.tolist()]
    bad = [(v, g, w) for v, g, w in zip(values.tolist(), got, want) if repr(g) != repr(w)]
    assert not bad, bad[:5]


def test_round12_equals_the_text_rounding_on_hard_cases():
    hard = [0.0, -0.0, 1.0, 10.0, 1e11, 1e12, 1e-9, 1e-10, 1e29, 1e30, 1e300, 5e-324, 1.7976931348623157e308,
            1000000000000.5, 100000000000.5, 0.5, 2.5, 9.9999999999995, 9.99999999999949, 99999999999.95,
            0.1 + 0.2, 1 / 3, 2 / 3, 1712195495519689.047, 123456789012.5, 1.23456789012500e-7,
            math.inf, -math.inf, math.nan]
    finite = [x for x in hard if math.isfinite(x) and x and abs(x) < 1e308]
    hard += [float(np.nextafter(x, 0)) for x in finite] + [float(np.nextafter(x, 2 * x)) for x in finite]
    hard += [10.0 ** e for e in range(-30, 31)] + [5 * 10.0 ** e for e in range(-30, 31)]
    got = round12(np.array(hard, dtype=float))
    for v, g in zip(hard, got):
        assert repr(g) == repr(_reference(v)), v
    assert got[:2] == [0.0, -0.0] and math.copysign(1, got[1]) == -1


def test_json_rows_written_as_text_equal_the_encoder(tmp_path):
    # many communication kernels of several kinds, sizes and groups, on two ranks
    for rank in (0, 1):
        ks = []
        for i in range(3000):
            t = 10.0 + 7.25 * i + 0.001 * rank
            ks.append(kernel(f"gemm_{i % 3}", t, 3.0 + (i % 5) / 3))
            ks.append(nccl(("all_reduce", "all_gather", "reduce_scatter")[i % 3], t + 1, 2.0 + (i % 7) / 7,
                           nelems=(i % 11) * 1000 + 1, group=str(i % 2), size=2))
        write(trace(ks, rank=rank, world=2), tmp_path / f"rank{rank}.json")
    a = analyze([tmp_path])
    out = io.StringIO()
    write_json(a, out)
    assert out.getvalue() == json.dumps(a.to_dict(), indent=2, allow_nan=False) + "\n"
    rows = a.comm_kernels()
    assert len(rows) == 6000
    assert rows[17] == json_ready(rows[17])


def test_factorize_equals_numpy_unique():
    rng = np.random.default_rng(3)
    keys = rng.integers(-5, 40, size=10_000) * 6 + rng.integers(0, 6, size=10_000)
    u, inv = _factorize(keys)
    u0, inv0 = np.unique(keys, return_inverse=True)
    assert np.array_equal(u, u0) and np.array_equal(inv, inv0.reshape(-1))
    for hi in (1 << 20, 1 << 40):                     # small ids packed, huge ones by np.unique(axis=1)
        dev = rng.integers(-1, 3, size=5000)
        stream = rng.integers(-hi, hi, size=5000)
        stream[:50] = 7
        got = _factorize_pairs(dev, stream)
        want = np.unique(np.stack([dev, stream]), axis=1, return_inverse=True)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1].reshape(-1))


def test_launch_shape_hashes_are_those_of_the_decoded_grid_and_block(tmp_path):
    # the typed path keys its cache on the raw text "grid|block": shapes whose texts run together
    # the same way ("1" "23" / "12" "3", "10" and none / "1" "0") still get their own hash
    from ccoverlap.trace import load
    from ccoverlap.trace.columns import _shape_hash

    shapes = [([64, 1, 1], [128, 1, 1]), (1, 23), (12, 3), (10, None), (1, 0), ("a|b", "c"), ("a", "b|c"),
              ([64, 1, 1], [128, 1, 1]), (None, None)]
    ks = []
    for i, (g, b) in enumerate(shapes):
        args = {k: v for k, v in (("grid", g), ("block", b)) if v is not None}
        ks.append(kernel(f"k{i}", 100 * i, 10, **args))
    raw = load.load_trace(write(trace(ks), tmp_path / "shapes.json"))
    got = dict(zip((raw.names[n] for n in raw.k_nid), raw.k_shape.tolist()))
    assert [got[f"k{i}"] for i in range(len(shapes))] == [_shape_hash(g, b) for g, b in shapes]
    assert len({got["k1"], got["k2"], got["k3"], got["k4"]}) == 3      # 1,23 and 12,3 hash alike (as before)


def test_the_contention_median_is_numpys():
    from ccoverlap.trace.contention import _median_of

    rng = np.random.default_rng(7)
    for n in list(range(1, 12)) + [100, 101]:
        for a in (rng.random(n) * 1e-3, rng.integers(0, 4, n) * 1e-6, np.full(n, 1e-5)):
            assert _median_of(a) == float(np.median(a)), a      # exactly: the same two values, the same mean


def test_the_pooled_contention_medians_are_numpys():
    """Per kernel, the median of the distinct durations each repeated its count (taken for all
    kernels at once) is ``np.median`` of the durations written out, to the last bit; counts of
    zero (a duration seen only overlapped) are skipped over."""
    from ccoverlap.trace.contention import _medians

    rng = np.random.default_rng(11)
    for _ in range(200):
        groups = [np.unique(rng.integers(1, 40, rng.integers(1, 9)) * 1e-6 * rng.random()) for _ in range(5)]
        counts = [rng.integers(0, 4, len(g)) for g in groups]
        for c in counts:
            c[rng.integers(len(c))] += 1                     # every group has at least one sample
        values, cnt = np.concatenate(groups), np.concatenate(counts)
        cut = np.cumsum([0] + [len(g) for g in groups[:-1]])
        got = _medians(values, cnt, cut, np.add.reduceat(cnt, cut))
        want = [float(np.median(np.repeat(g, c))) for g, c in zip(groups, counts)]
        assert got.tolist() == want, (groups, counts)


def test_pooled_contention_merges_ranks_as_they_come_or_at_the_end_alike():
    """The ranks' (kernel, duration) rows merged when they outnumber the merged ones or all at
    the end: the same rows, the same result."""
    from ccoverlap.trace import contention as ct

    rng = np.random.default_rng(5)

    def rank(r: int) -> dict:
        key = rng.integers(0, 3, 50)
        return {"per_rank": {"slowdown": 1.0, "time_lost_s": 0.0, "kernels": 0}, "over_time_s": 1e-3,
                "labels": [f"k{(r + j) % 4}" for j in range(3)], "key": key,
                "dur_s": rng.integers(10, 20, 50) * 1e-6, "n_alone": rng.integers(0, 3, 50),
                "n_over": rng.integers(0, 3, 50)}

    ranks = [rank(r) for r in range(6)]
    every, once = ct.PooledContention(), ct.PooledContention()
    for r, s in enumerate(ranks):
        every.add(r, s)
        every.cols      # noqa: B018 - merged after every rank
        once.add(r, s)
    assert {k: v.tolist() for k, v in every.cols.items()} == {k: v.tolist() for k, v in once.cols.items()}
    assert every.result(min_samples=2) == once.result(min_samples=2)
    assert once.result(min_samples=2).kernels      # the comparison is not empty
