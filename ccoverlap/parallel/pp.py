"""Pipeline schedules as per-rank task orders, and where each model stage lives.

A task is ``(kind, microbatch, chunk)`` with kind ``"F"`` or ``"B"``; ``chunk`` picks which
of a rank's model chunks runs (interleaved: V chunks; DualPipe: 2). The step builder plays the
tasks in this order on the rank's compute stream and links stages with send/receive ops, so
the bubble comes out of the simulation, not from a formula.

* GPipe (Huang et al., 2019): all forwards, then all backwards. Bubble (P−1)/M.
* 1F1B (PipeDream-Flush; Narayanan et al., 2021 §2.2): ``min(P−r−1, M)`` warm-up forwards,
  then one-forward-one-backward, then the cool-down backwards. Bubble (P−1)/M, at most P
  micro-batches in flight.
* Interleaved 1F1B (Narayanan et al., 2021 §2.2.2; Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): rank r holds model stages
  ``c·P + r`` for c < V; warm-up ``(P−r−1)·2 + (V−1)·P`` virtual micro-batches; the k-th
  forward runs chunk ``(k // P) % V`` of micro-batch ``(k // PV)·P + k % P``. Bubble (P−1)/(M·V).
  With a *group* of ``G`` micro-batches (``P ≤ G ≤ M``, ``G`` dividing ``M``) launched together
  per model chunk instead of ``P`` (Lamy-Poirier 2023's breadth-first pipeline; Centauri
  §3.2.3, Fig. 7 c-d: "launching several micro-batches of an identical model chunk together"
  to overlap the data-parallel collectives), ``P`` becomes ``G`` in the chunk and micro-batch
  of the k-th task and in the ``(V−1)·G`` part of the warm-up; ``G = M`` is breadth-first.
* DualPipe (DeepSeek-V3 technical report §3.2.1): rank r holds stage r for the first half
  of the micro-batches, fed from rank 0, and stage P−1−r for the second half, fed from rank
  P−1 (two copies of the parameters). The order is the reference implementation's eight
  steps (see :func:`_dualpipe`). Not modelled: the overlap *inside* an F&B pair (one
  micro-batch's forward with another's backward, to hide EP all-to-alls; here they run one
  after the other) and the zero-bubble split of the backward into input and weight parts, so
  the bubble is (P/2 − 1)(F + 2B) rather than DeepSeek-V3 Table 2's (P/2 − 1)(F&B + B − 3W).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ccoverlap.errors import ConfigError

Task = tuple  # (kind "F" | "B", microbatch, chunk)


@dataclass(frozen=True)
class Schedule:
    """Per-rank task orders plus the stage mapping. ``stages`` = model stages in the pipeline."""

    name: str
    pp: int
    microbatches: int
    stages: int
    orders: tuple  # orders[rank] = tuple of tasks
    chunk_stage: tuple  # chunk_stage[rank][chunk] = model stage index
    direction_of_chunk: tuple  # for DualPipe: which feeding direction a chunk serves

    def stage_of(self, rank: int, chunk: int) -> int:
        """Model stage run by ``chunk`` of ``rank``."""
        return self.chunk_stage[rank][chunk]

    def place(self, stage: int, mb: int) -> tuple[int, int]:
        """(rank, chunk) that runs model stage ``stage`` for micro-batch ``mb``."""
        if self.name == "dualpipe":
            if mb < self.microbatches // 2:
                return stage, 0
            return self.pp - 1 - stage, 1
        if self.name == "interleaved":
            return stage % self.pp, stage // self.pp
        return stage, 0


@functools.lru_cache(maxsize=64)
def make_schedule(name: str, pp: int, microbatches: int, virtual_stages: int = 1, group: int = 0) -> Schedule:
    """The named schedule for ``pp`` ranks and ``microbatches`` micro-batches (cached: a
    Schedule is immutable, and the step builder and the memory estimate both ask for it).
    ``group``: micro-batches launched together per model chunk in the interleaved schedule
    (0: ``pp``, Megatron-LM's; see the module doc)."""
    P, M = pp, microbatches
    G = group or P
    if group and name != "interleaved":
        raise ConfigError(f"a pipeline group of {group} micro-batches needs the interleaved schedule, got {name!r}")
    if group and P > 1 and not (P <= G <= M and M % G == 0):
        raise ConfigError(f"pipeline group {G} must be between pp={P} and the {M} micro-batches and divide them")
    if P < 1 or M < 1:
        raise ConfigError(f"pipeline needs pp >= 1 and micro-batches >= 1, got pp={P}, micro-batches={M}")
    if name == "gpipe":
        orders = tuple(tuple([("F", m, 0) for m in range(M)] + [("B", m, 0) for m in range(M)]) for _ in range(P))
        return Schedule(name, P, M, P, orders, tuple((r,) for r in range(P)), ())
    if name == "1f1b":
        return Schedule(name, P, M, P, tuple(_one_f_one_b(P, M, r) for r in range(P)),
                        tuple((r,) for r in range(P)), ())
    if name == "interleaved":
        V = virtual_stages
        if P > 1 and M % P:
            raise ConfigError(f"the interleaved schedule needs micro-batches ({M}) to be a multiple of pp={P}")
        orders = tuple(_interleaved(P, M, V, r, G) for r in range(P))
        return Schedule(name, P, M, P * V, orders, tuple(tuple(c * P + r for c in range(V)) for r in range(P)), ())
    if name == "dualpipe":
        if P % 2 or M % 2:
            raise ConfigError(f"DualPipe needs an even pp and an even number of micro-batches, got pp={P}, "
                              f"micro-batches={M}")
        return Schedule(name, P, M, P, _dualpipe(P, M), tuple((r, P - 1 - r) for r in range(P)), (0, 1))
    raise ConfigError(f"unknown pipeline schedule {name!r}; expected gpipe, 1f1b, interleaved or dualpipe")


def _one_f_one_b(P: int, M: int, r: int) -> tuple:
    warm = min(P - r - 1, M)
    out = [("F", m, 0) for m in range(warm)]
    for i in range(M - warm):
        out.append(("F", warm + i, 0))
        out.append(("B", i, 0))
    out += [("B", m, 0) for m in range(M - warm, M)]
    return tuple(out)


def _interleaved(P: int, M: int, V: int, r: int, G: int = 0) -> tuple:
    total = M * V
    G = G or P

    def mb(k: int) -> int:
        return (k // (G * V)) * G + k % G

    def f(k: int) -> tuple:
        return ("F", mb(k), (k // G) % V)

    def b(k: int) -> tuple:
        return ("B", mb(k), V - 1 - (k // G) % V)

    warm = min((P - r - 1) * 2 + (V - 1) * G, total)
    out = [f(k) for k in range(warm)]
    for i in range(total - warm):
        out.append(f(warm + i))
        out.append(b(i))
    out += [b(k) for k in range(total - warm, total)]
    return tuple(out)


def _dualpipe(P: int, M: int) -> tuple:
    """DualPipe's per-rank order, following the eight steps of the reference implementation
    (deepseek-ai/DualPipe, ``DualPipe.step``) with the backward not split into input and
    weight parts (no zero-bubble W) and each overlapped F&B pair run as F then B.

    From rank r's view, phase 0 is the direction in which it is an early stage
    (``hr = min(r, P−1−r)``), phase 1 the one in which it is stage ``P−1−hr``."""
    half_ranks, half_chunks = P // 2, M // 2
    orders = []
    for r in range(P):
        hr = min(r, P - 1 - r)
        second = r >= half_ranks
        chunk = (1, 0) if second else (0, 1)  # local phase -> direction (= chunk)
        nxt_f = [0, 0]
        nxt_b = [0, 0]
        out: list = []

        def f(ph: int) -> None:
            c = chunk[ph]
            out.append(("F", c * half_chunks + nxt_f[ph], c))
            nxt_f[ph] += 1

        def b(ph: int) -> None:
            c = chunk[ph]
            out.append(("B", c * half_chunks + nxt_b[ph], c))
            nxt_b[ph] += 1

        for _ in range((half_ranks - hr - 1) * 2):  # step 1: nF0
            f(0)
        for _ in range(hr + 1):  # step 2: nF0F1
            f(0)
            f(1)
        for _ in range(half_ranks - hr - 1):  # step 3: nB1F1
            b(1)
            f(1)
        for _ in range(half_chunks - P + hr + 1):  # step 4: nF0B1F1B0
            f(0)
            b(1)
            f(1)
            b(0)
        for _ in range(half_ranks - hr - 1):  # step 5: nB1F1B0
            b(1)
            f(1)
            b(0)
        for _ in range(hr + 1):  # step 6: nB1B0
            b(1)
            b(0)
        for _ in range(half_ranks - hr - 1):  # step 7: nB0 (its W parts are not split off)
            b(0)
        orders.append(tuple(out))
    return tuple(orders)


def in_flight(schedule: Schedule, rank: int, chunks: tuple[int, ...] | None = None) -> int:
    """Most micro-batch chunks whose forward has run on ``rank`` but not their backward
    (activation memory multiplier, in chunk units); only those of ``chunks`` when given."""
    live = peak = 0
    for kind, _, chunk in schedule.orders[rank]:
        if chunks is not None and chunk not in chunks:
            continue
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak
