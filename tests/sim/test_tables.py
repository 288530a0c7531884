"""The simulator's static tables against plain-Python definitions."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ccoverlap.sim.tables import _streams


def _reference_streams(ranks, streams):
    """(stream id per op, position per op, rank per stream, queues): streams numbered in
    first-use order of (rank, stream name), op by op."""
    ids: dict = {}
    queues: list = []
    sid, pos = [], []
    for i, key in enumerate(zip(ranks, streams)):
        if key not in ids:
            ids[key] = len(ids)
            queues.append([])
        s = ids[key]
        sid.append(s)
        pos.append(len(queues[s]))
        queues[s].append(i)
    return sid, pos, [r for r, _ in ids], queues


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 7, -3, 10**9, 70000]), st.sampled_from(["a", "b", "c"])),
                min_size=1, max_size=60))
def test_streams_match_first_use_numbering(ops):
    # small, negative and sparse ranks (the last two take the dense-numbering path)
    ranks = [r for r, _ in ops]
    names = [s for _, s in ops]
    sarr, pos, stream_rank, queues = _streams(np.array(ranks, dtype=np.int64), names)
    assert (sarr.tolist(), pos.tolist(), stream_rank, queues) == _reference_streams(ranks, names)
