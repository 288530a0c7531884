"""Which rank each trace file is: from its ``distributedInfo``, its file name, or file order.

Split out of :mod:`ccoverlap.trace.load` (which calls :func:`rank_from_meta` on every file it
streams): :func:`rank_from_meta` reads one file's own
evidence, :func:`assign_ranks` makes the ranks of a set of files unique and drops files that
cannot belong to the same job, with one message per file.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, TypeVar

from ccoverlap.config import short
from ccoverlap.trace.sources import Source, file_name

__all__ = ["rank_from_meta", "assign_ranks", "RankClaim", "RankEvidence"]


class RankClaim(Protocol):
    """What :func:`assign_ranks` reads and sets on a trace file: a loaded trace
    (:class:`~ccoverlap.trace.load.RawTrace`) or a rank's summary
    (:class:`~ccoverlap.trace.summary.RankSummary`). Defined here, not imported from either, so
    that this module stays below both."""

    rank: int | None
    world_size: int | None
    rank_source: str

    @property
    def path(self) -> Source: ...


class RankEvidence(RankClaim, Protocol):
    """A trace file whose own header :func:`rank_from_meta` reads (``meta``) and warns about."""

    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def warnings(self) -> list[str]: ...


_R = TypeVar("_R", bound=RankClaim)

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


#: Largest rank or world size a trace may state (a larger one is ignored, with a warning).
MAX_RANK = 2**31 - 1


def _as_int(v: object) -> int | None:
    """A rank or world size 0 .. :data:`MAX_RANK` written as int, integral float or ASCII digits; else None."""
    if v.__class__ is int:
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    elif isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= len(str(MAX_RANK)):
        n = int(v)
    else:
        return None
    return n if 0 <= n <= MAX_RANK else None


def _header_number(raw: RankEvidence, info: dict[str, Any], key: str) -> int | None:
    """``distributedInfo[key]`` as a rank number; a value that is there but is not one is ignored
    with a warning naming the file and the field."""
    v = info.get(key)
    n = _as_int(v)
    if n is None and v is not None:
        raw.warnings.append(f"{raw.path}: distributedInfo.{key} {short(v)} is not a whole number 0..{MAX_RANK} "
                            f"- ignored")
    return n


def rank_from_meta(raw: RankEvidence) -> None:
    """Set ``raw.rank`` / ``raw.world_size`` / ``raw.rank_source`` of one trace from its
    ``distributedInfo``, else the rank from the file name (``rank3``, ``rank-3``, ``_rank_3``).
    A value that is not a rank (not a whole number 0 .. :data:`MAX_RANK`: ``"²"``, a 5000-digit
    string, 2**64) is ignored with a warning and the next evidence decides, as for a missing one."""
    info = raw.meta.get("distributedInfo")
    if isinstance(info, dict):
        raw.rank = _header_number(raw, info, "rank")
        raw.world_size = _header_number(raw, info, "world_size")
        if raw.rank is not None:
            raw.rank_source = "distributedInfo"
            return
    digits = _name_digits(raw)
    if digits is not None:
        raw.rank = _as_int(digits)
        if raw.rank is None:
            raw.warnings.append(f"{raw.path}: the rank in the file name ({short(digits)}) is larger than "
                                f"{MAX_RANK} - ignored")
        else:
            raw.rank_source = "file name"


def _name_digits(r: RankClaim) -> str | None:
    """The digits of the last ``rank<N>`` in the file name of ``r`` (None: none)."""
    m = None
    for m in _RANK_IN_NAME.finditer(file_name(r.path)):
        pass
    return m.group(1) if m is not None else None


def _evidence(r: RankClaim, world: int | None) -> tuple[bool, bool, bool, float, int]:
    """How strongly a file backs the rank it claims: states the job's world size, its file name
    agrees, it has something to measure, fewer malformed events, more events."""
    name = _name_rank(r)
    events = getattr(r, "n_events", 0) or 0
    bad = getattr(r, "n_malformed", 0) or 0
    return (world is not None and r.world_size == world, name is None or name == r.rank,
            not getattr(r, "empty", False) and (getattr(r, "n_device", 1) > 0 or getattr(r, "mode", "") == "cpu"),
            -(bad / events if events else 1.0), events)


def _why(r: RankClaim, world: int | None) -> str:
    ws, name_ok, usable, good, events = _evidence(r, world)
    name = _name_rank(r)
    return (f"{'states' if ws else 'does not state'} world size {world}, "
            f"file name {'agrees' if name_ok and name is not None else 'names no rank' if name is None else f'says rank {name}'}, "
            f"{'has' if usable else 'has no'} GPU events to measure, {-good:.0%} malformed of {events} events")


def _name_rank(r: RankClaim) -> int | None:
    digits = _name_digits(r)
    return _as_int(digits) if digits is not None else None


def assign_ranks(raws: list[_R]) -> tuple[list[_R], list[str]]:
    """Give every trace a unique rank; drop what cannot belong to the same job.

    Order of evidence: ``distributedInfo.rank``, then ``rank-3`` / ``rank3`` / ``_rank_3`` in
    the file name, then (said plainly, per file) the next free rank in file order. Traces
    whose ``world_size`` differs from the most common one, and second files claiming an
    already-taken rank (a file stating the world size wins over one that does not), are
    dropped with a message naming the file. Two files claiming the same rank are decided by
    evidence (:func:`_evidence`: the job's world size stated, the file name agreeing, something to
    measure, fewer malformed events, more events); the message names both files and why.
    """
    problems: list[str] = []
    sizes = [r.world_size for r in raws if r.world_size]
    world = max(set(sizes), key=lambda s: (sizes.count(s), -s)) if sizes else None
    kept: list[_R] = []
    for r in raws:
        if world is not None and r.world_size is not None and r.world_size != world:
            problems.append(f"{r.path}: world_size {r.world_size} differs from the other traces' {world} "
                            f"- a different job? skipped")
            continue
        kept.append(r)
    taken: set[int] = set()
    out: list[_R] = []
    claims: dict[int, list[_R]] = {}
    for r in kept:
        if r.rank is not None:
            claims.setdefault(r.rank, []).append(r)
    for rank in sorted(claims):
        rs = claims[rank]
        best = max(rs, key=lambda r: _evidence(r, world))      # max keeps the first of equals
        taken.add(rank)
        out.append(best)
        for r in rs:
            if r is not best:
                problems.append(f"{r.path}: rank {rank} (from {r.rank_source}) is also claimed by {best.path}; "
                                f"kept {best.path} ({_why(best, world)}) over this file ({_why(r, world)}) - skipped")
    for r in kept:
        if r.rank is None:
            nxt = 0
            while nxt in taken:
                nxt += 1
            r.rank = nxt
            r.rank_source = "file order"
            taken.add(nxt)
            problems.append(f"{r.path}: no rank in distributedInfo or file name - assumed rank {nxt} "
                            f"(file order)")
            out.append(r)
    for r in out:
        if r.world_size is None:
            r.world_size = world
    if world is not None:
        for r in out:
            if r.rank is not None and r.rank >= world:
                problems.append(f"{r.path}: rank {r.rank} is outside world_size {world}")
    out.sort(key=lambda r: r.rank if r.rank is not None else -1)
    return out, problems
