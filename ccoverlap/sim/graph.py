"""Operations of a training step and the graph that orders them on GPU streams.

An :class:`Op` is one kernel-like unit of work on one stream of one simulated rank: a
GEMM, an attention kernel, a memory-bound (elementwise) kernel, a collective, a
point-to-point transfer or a copy. Its *spec* says what it computes or moves; the cost
model turns a spec into seconds. Ops on the same ``(rank, stream)`` run in the order they
were added (CUDA stream semantics); ``deps`` add cross-stream / cross-rank edges
(CUDA events, or a receive waiting for a send).

Ranks here are *simulated* ranks: ranks with identical roles (all members of a DP or TP
group doing the same thing at the same time) are simulated once, so a graph of a
1024-GPU job usually holds one rank per pipeline stage.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from ccoverlap.errors import ConfigError
from ccoverlap.specs import COMPUTE, Spec, kind_of


class Op(NamedTuple):
    """One unit of work on one stream of one simulated rank (an immutable record: a 1000-GPU
    step holds 10^5 of them; make a changed copy with ``op._replace(...)``).

    ``duration_s`` overrides the cost model (used for measured or synthetic ops in tests).
    ``layer``, ``microbatch`` and ``phase`` (fwd | bwd | opt | ...) are labels for reports.
    """

    op_id: int
    name: str
    rank: int
    stream: str
    spec: Spec | None
    deps: tuple[int, ...] = ()
    duration_s: float | None = None
    layer: int = -1
    microbatch: int = -1
    phase: str = ""

    @property
    def kind(self) -> str:
        return COMPUTE if self.spec is None else kind_of(self.spec)


_new_op = tuple.__new__  # Op(...) without the keyword handling of the generated __new__


class OpGraph:
    """Ops in issue order, per (rank, stream) FIFO, plus explicit dependencies.

    Builders call :meth:`add`, which returns the new op's id to use in later ``deps``.
    ``rank_weights`` maps a simulated rank to how many real ranks it stands for.
    """

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.meta: dict[str, object] = {}

    def add(
        self,
        name: str,
        spec: Spec | None,
        *,
        rank: int = 0,
        stream: str = "compute",
        deps: Iterable[int | None] = (),
        duration_s: float | None = None,
        layer: int = -1,
        microbatch: int = -1,
        phase: str = "",
    ) -> int:
        """Append an op; ``None`` entries in ``deps`` are ignored (convenient for optional edges).
        ``deps`` are stored sorted and without repeats."""
        ops = self.ops
        op_id = len(ops)
        if not deps:
            clean: tuple[int, ...] = ()
        else:
            clean = tuple(sorted({d for d in deps if d is not None}))
            if clean and not (0 <= clean[0] and clean[-1] < op_id):
                bad = next(d for d in clean if not 0 <= d < op_id)
                raise ConfigError(f"op {name!r}: dependency {bad} does not name an earlier op")
        if duration_s is not None and duration_s < 0:
            raise ConfigError(f"op {name!r}: duration must be non-negative")
        ops.append(_new_op(Op, (op_id, name, rank, stream, spec, clean, duration_s, layer, microbatch, phase)))
        return op_id

    def append_op(self, name: str, spec: Spec | None, rank: int, stream: str, deps: tuple[int, ...],
                  layer: int = -1, microbatch: int = -1, phase: str = "") -> int:
        """:meth:`add` for builders that already hold a clean ``deps`` tuple (sorted, no
        repeats, earlier ids only: not checked) — the step builder's hot path."""
        ops = self.ops
        op_id = len(ops)
        ops.append(_new_op(Op, (op_id, name, rank, stream, spec, deps, None, layer, microbatch, phase)))
        return op_id

    def __len__(self) -> int:
        return len(self.ops)

    def streams(self) -> list[tuple[int, str]]:
        """The (rank, stream) pairs in first-use order."""
        seen: dict[tuple[int, str], None] = {}
        for op in self.ops:
            seen.setdefault((op.rank, op.stream), None)
        return list(seen)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a step graph is built or played.

    Building or simulating a 1000-GPU step allocates 10^5 small records and lists, which
    makes the collector walk every live object again and again (a third of the build time);
    none of them form cycles that need collecting meanwhile. Re-enabled on exit if it was on.

    On exit the objects made meanwhile are handed to the oldest generation without a pass
    (``gc.freeze()`` then ``gc.unfreeze()``, which also resets the young generation's
    allocation count): otherwise re-enabling starts a young collection at once that walks all
    10^5 new records only to find no garbage (about 7% of a GPT-3 175B step's build + play).
    They are looked at by the next full collection instead, as any long-lived object is.
    Skipped when the caller has frozen objects itself (unfreezing would undo that)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
