"""Op templates: a :class:`Segment` is a short, reusable list of ops (one sublayer's forward,
one all-to-all, ...) with dependencies local to the segment, built once per configuration and
stamped into the :class:`~ccoverlap.sim.graph.OpGraph` many times (every layer, every micro-batch).

Streams inside a template are *logical*: ``"compute"``, ``"tp"`` (tensor-parallel
collectives), ``"ep"`` (expert all-to-all). The step builder maps them to real stream names
(``tp_comm``, ``ep_comm``) or, with ``overlap=False``, all to ``compute``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from ccoverlap.specs import Spec

IN = -1  # a dependency on the segment's input (the op that produced the data it consumes)
# A dependency may also be a string: the op another segment of the same micro-batch chain
# exported under that key (e.g. the MoE block's normed input, used by the shared experts).
Dep: TypeAlias = int | str


@dataclass(slots=True)
class TOp:
    """One op of a template. ``deps`` are indices of earlier ops in the same segment, or ``IN``;
    ``tensor`` names the weight whose gradient this op finishes (for DDP buckets / FSDP);
    ``export`` publishes the op's id under a key for later segments of the same chain."""

    name: str
    spec: Spec | None
    stream: str = "compute"
    deps: tuple[Dep, ...] = ()
    tensor: str = ""
    export: str = ""


@dataclass(slots=True)
class Segment:
    """A template. ``out``: index of the op whose completion makes the result available;
    ``comm_only``: a lone collective (all-to-all), used to interleave two half-batches."""

    name: str
    ops: list[TOp] = field(default_factory=list)
    unit: str = ""
    out: int = -1
    comm_only: bool = False

    def add(self, name: str, spec: Spec | None, stream: str = "compute", deps: Iterable[Dep] = (), tensor: str = "",
            export: str = "") -> int:
        """Append an op; returns its local index."""
        self.ops.append(TOp(name, spec, stream, tuple(deps), tensor, export))
        return len(self.ops) - 1

    def last(self) -> int:
        """Local index of the last op."""
        return len(self.ops) - 1

    def finish(self, out: int | None = None) -> Segment:
        """Set the output op (default: the last op) and return self."""
        self.out = self.last() if out is None else out
        return self

    def renamed(self, prefix: str) -> Segment:
        """A copy with every op name prefixed (recomputation in backward) and no tensor tags."""
        s = Segment(name=prefix + self.name, unit=self.unit, out=self.out, comm_only=self.comm_only)
        s.ops = [TOp(prefix + o.name, o.spec, o.stream, tuple(d for d in o.deps if not isinstance(d, str)), "", "")
                 for o in self.ops]
        return s
