"""Centauri's communication partition (Centauri §3.1), as functions equal to the collective they replace.

Three dimensions, each a drop-in for a plain collective (same result, finer pieces that a
scheduler can overlap separately):

* primitive substitution (§3.1.1, Table 2): all-reduce = reduce-scatter + all-gather;
  all-gather = broadcasts of distinct roots; reduce-scatter = reduces of distinct roots;
* group partition (§3.1.2): the group is laid out as a 2-D mesh ``[N_inter, N_intra]``
  (rank ``r`` has index ``(r // N_intra, r % N_intra)``, the paper's
  ``index(r)_k = (r / prod_{i>k} N_i) % N_k``), and the collective runs as one collective on
  each sub-group, intra-node or inter-node first;
* workload partition (§3.1.3): the data is cut into ``chunks`` pieces (an int, or fractions
  such as Algorithm 1's ``[inter/world, 1 - inter/world]``) issued asynchronously; each
  piece has its own handle so dependent compute can start on the first piece.

All-gather and reduce-scatter work along dim 0 in rank order, like
``all_gather_into_tensor``/``reduce_scatter_tensor`` on the flat group. Inputs must have the
same shape on every rank (as those collectives require).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ccoverlap.runtime import comm
from ccoverlap.runtime.comm import Handle

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "all_reduce_as_rs_ag",
    "all_gather_as_broadcasts",
    "reduce_scatter_as_reduces",
    "Mesh2D",
    "make_mesh_2d",
    "hierarchical_all_gather",
    "hierarchical_reduce_scatter",
    "hierarchical_all_reduce",
    "Partitioned",
    "partitioned_all_gather",
    "partitioned_reduce_scatter",
    "partitioned_all_reduce",
    "chunk_sizes",
]


# ------------------------------------------------------------------ primitive substitution
def all_reduce_as_rs_ag(t: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """All-reduce (sum) as reduce-scatter + all-gather (Centauri §3.1.1, Table 2); returns a new tensor.

    ``t`` is flattened and zero-padded to a multiple of the group size; the result has
    ``t``'s shape and equals ``all_reduce(t)``. Both halves are separately schedulable.
    """
    p = comm.group_size(group)
    flat = t.reshape(-1)
    per = -(-flat.numel() // p)
    padded = torch.zeros(per * p, dtype=t.dtype, device=t.device)
    padded[: flat.numel()] = flat
    part = torch.empty(per, dtype=t.dtype, device=t.device)
    comm.reduce_scatter_into(part, padded, group=group).wait()
    full = torch.empty(per * p, dtype=t.dtype, device=t.device)
    comm.all_gather_into(full, part, group=group).wait()
    return full[: flat.numel()].view(t.shape)


def all_gather_as_broadcasts(x: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """All-gather along dim 0 as P broadcasts, root j sending its shard (Centauri §3.1.1, Table 2).

    All P broadcasts are issued asynchronously, then waited; returns ``[P*m, ...]``.
    """
    p, r = comm.group_size(group), comm.group_rank(group)
    out = torch.empty(p * x.shape[0], *x.shape[1:], dtype=x.dtype, device=x.device)
    blocks = out.view(p, *x.shape)
    blocks[r].copy_(x)
    handles = [comm.broadcast(blocks[j], j, group=group) for j in range(p)]
    for h in handles:
        h.wait()
    return out


def reduce_scatter_as_reduces(x: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
    """Reduce-scatter (sum) along dim 0 as P reduces of distinct roots (Centauri §3.1.1, Table 2).

    Block j of ``x`` is reduced onto rank j; returns this rank's ``[rows/P, ...]`` block.
    """
    p, r = comm.group_size(group), comm.group_rank(group)
    if x.shape[0] % p:
        raise ValueError(f"reduce_scatter_as_reduces: dim 0 ({x.shape[0]}) not divisible by {p} ranks")
    blocks = x.reshape(p, x.shape[0] // p, *x.shape[1:])
    bufs = [blocks[j].clone() for j in range(p)]  # reduce overwrites its input
    handles = [comm.reduce(bufs[j], j, group=group) for j in range(p)]
    for h in handles:
        h.wait()
    return bufs[r]


# ------------------------------------------------------------------------ group partition
@dataclass(frozen=True)
class Mesh2D:
    """A 2-D ``[inter, intra]`` layout of a group with this rank's two sub-groups (Centauri §3.1.2)."""

    inter_size: int
    intra_size: int
    intra_group: ProcessGroup  # ranks on the same node (same inter index)
    inter_group: ProcessGroup  # ranks with the same local index on every node
    device_mesh: DeviceMesh | None = None  # the torch DeviceMesh, when built from one

    @property
    def size(self) -> int:
        """Ranks in the mesh (``inter_size * intra_size``)."""
        return self.inter_size * self.intra_size


def make_mesh_2d(inter_size: int, intra_size: int, device_type: str = "cpu") -> Mesh2D:
    """Build a 2-D DeviceMesh ``(inter, intra)`` over the default group (collective; all ranks call it).

    On CPU this uses gloo (e.g. world 4 as 2x2). Rank r sits at ``(r // intra, r % intra)``.
    """
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if inter_size * intra_size != world:
        raise ValueError(f"make_mesh_2d: {inter_size} x {intra_size} != world size {world}")
    mesh = init_device_mesh(device_type, (inter_size, intra_size), mesh_dim_names=("inter", "intra"))
    return Mesh2D(inter_size, intra_size, mesh.get_group("intra"), mesh.get_group("inter"), mesh)


def hierarchical_all_gather(x: torch.Tensor, mesh: Mesh2D, order: str = "intra_first") -> torch.Tensor:
    """All-gather along dim 0 over the whole mesh as two sub-group all-gathers (Centauri §3.1.2).

    ``order="intra_first"``: gather the node's block over fast links, then the blocks across
    nodes (already in global rank order). ``"inter_first"``: across nodes first, then within
    the node, then a permute ``[intra, inter] -> [inter, intra]`` restores rank order.
    Returns the same tensor as a flat all-gather: ``[P*m, ...]``.
    """
    m, rest = x.shape[0], x.shape[1:]
    a, b = mesh.inter_size, mesh.intra_size
    x = x.contiguous()
    if order == "intra_first":
        node = torch.empty(b * m, *rest, dtype=x.dtype, device=x.device)
        comm.all_gather_into(node, x, group=mesh.intra_group).wait()
        out = torch.empty(a * b * m, *rest, dtype=x.dtype, device=x.device)
        comm.all_gather_into(out, node, group=mesh.inter_group).wait()
        return out
    if order == "inter_first":
        col = torch.empty(a * m, *rest, dtype=x.dtype, device=x.device)
        comm.all_gather_into(col, x, group=mesh.inter_group).wait()
        tmp = torch.empty(b * a * m, *rest, dtype=x.dtype, device=x.device)
        comm.all_gather_into(tmp, col, group=mesh.intra_group).wait()
        return tmp.view(b, a, m, *rest).transpose(0, 1).reshape(a * b * m, *rest)
    raise ValueError(f"order must be 'intra_first' or 'inter_first', got {order!r}")


def hierarchical_reduce_scatter(x: torch.Tensor, mesh: Mesh2D, order: str = "intra_first") -> torch.Tensor:
    """Reduce-scatter (sum) along dim 0 over the mesh as two sub-group reduce-scatters (Centauri §3.1.2).

    ``x``: ``[P*m, ...]``; rank ``(i, l)`` (global ``i*intra + l``) gets block ``i*intra + l``
    of the sum, as a flat reduce-scatter would give. ``"intra_first"`` reduces within the node
    first (the node's ranks each keep the rows of their local index on every node),
    ``"inter_first"`` across nodes first (each node keeps its own node's rows).
    """
    a, b = mesh.inter_size, mesh.intra_size
    if x.shape[0] % (a * b):
        raise ValueError(f"hierarchical_reduce_scatter: dim 0 ({x.shape[0]}) not divisible by {a * b}")
    m, rest = x.shape[0] // (a * b), x.shape[1:]
    if order == "intra_first":
        by_local = x.reshape(a, b, m, *rest).transpose(0, 1).contiguous()  # [intra, inter, m]
        mid = torch.empty(a * m, *rest, dtype=x.dtype, device=x.device)
        comm.reduce_scatter_into(mid, by_local.view(b * a * m, *rest), group=mesh.intra_group).wait()
        out = torch.empty(m, *rest, dtype=x.dtype, device=x.device)
        comm.reduce_scatter_into(out, mid, group=mesh.inter_group).wait()
        return out
    if order == "inter_first":
        mid = torch.empty(b * m, *rest, dtype=x.dtype, device=x.device)
        comm.reduce_scatter_into(mid, x.contiguous(), group=mesh.inter_group).wait()
        out = torch.empty(m, *rest, dtype=x.dtype, device=x.device)
        comm.reduce_scatter_into(out, mid, group=mesh.intra_group).wait()
        return out
    raise ValueError(f"order must be 'intra_first' or 'inter_first', got {order!r}")


def hierarchical_all_reduce(t: torch.Tensor, mesh: Mesh2D, order: str = "intra_first") -> torch.Tensor:
    """All-reduce (sum) over the mesh combining group partition and primitive substitution (Centauri §3.1).

    ``"intra_first"``: reduce-scatter inside the node, all-reduce the 1/intra slice across
    nodes, all-gather inside the node (only 1/intra of the data crosses nodes).
    ``"inter_first"``: the mirror image. Returns a new tensor equal to ``all_reduce(t)``.
    """
    if order not in ("intra_first", "inter_first"):
        raise ValueError(f"order must be 'intra_first' or 'inter_first', got {order!r}")
    first, second = (
        (mesh.intra_group, mesh.inter_group) if order == "intra_first" else (mesh.inter_group, mesh.intra_group)
    )
    p1 = comm.group_size(first)
    flat = t.reshape(-1)
    per = -(-flat.numel() // p1)
    padded = torch.zeros(per * p1, dtype=t.dtype, device=t.device)
    padded[: flat.numel()] = flat
    part = torch.empty(per, dtype=t.dtype, device=t.device)
    comm.reduce_scatter_into(part, padded, group=first).wait()
    comm.all_reduce(part, group=second).wait()
    full = torch.empty(per * p1, dtype=t.dtype, device=t.device)
    comm.all_gather_into(full, part, group=first).wait()
    return full[: flat.numel()].view(t.shape)


# --------------------------------------------------------------------- workload partition
def chunk_sizes(total: int, chunks: int | Sequence[float]) -> list[int]:
    """Rows per piece: ``chunks`` equal-ish pieces, or pieces in the given fractions (Centauri Alg. 1).

    Fractions are normalised; sizes are rounded so that they sum to ``total``. Zero-size
    pieces are kept (every rank computes the same list from the same ``total``).
    """
    if isinstance(chunks, int):
        if chunks < 1:
            raise ValueError("chunks must be >= 1")
        base, extra = divmod(total, chunks)
        return [base + (1 if i < extra else 0) for i in range(chunks)]
    fr = [float(f) for f in chunks]
    if not fr or min(fr) < 0 or sum(fr) <= 0:
        raise ValueError(f"chunk fractions must be non-negative and not all zero, got {fr}")
    s = sum(fr)
    bounds = [round(total * sum(fr[: i + 1]) / s) for i in range(len(fr))]
    return [bounds[0]] + [bounds[i] - bounds[i - 1] for i in range(1, len(bounds))]


class Partitioned:
    """Pieces of one partitioned collective: ``handles[i]`` completes piece ``i`` (rows ``spans[i]``).

    ``wait(i)`` waits for one piece (so compute can start on it); ``wait_all()`` returns
    the assembled result, identical to the unpartitioned collective.
    """

    def __init__(
        self, out: torch.Tensor, handles: list[Handle], spans: list[tuple[int, int]],
        finish: Callable[[int], None] | None = None,
    ) -> None:
        self.out, self.handles, self.spans, self._finish = out, handles, spans, finish
        self._done = [False] * len(handles)

    def wait(self, i: int) -> None:
        """Wait for piece ``i`` only (its rows of ``out`` are then final)."""
        if not self._done[i]:
            self.handles[i].wait()
            if self._finish is not None:
                self._finish(i)
            self._done[i] = True

    def wait_all(self) -> torch.Tensor:
        """Wait for every piece; returns the full result."""
        for i in range(len(self.handles)):
            self.wait(i)
        return self.out


def partitioned_all_gather(x: torch.Tensor, group: ProcessGroup | None = None, chunks: int | Sequence[float] = 2) -> Partitioned:
    """All-gather along dim 0 issued as pieces (Centauri §3.1.3): piece i gathers rows ``spans[i]`` of every shard.

    All pieces are issued asynchronously at once. ``out.view(P, m, ...)[:, lo:hi]`` holds
    piece i after ``wait(i)``; ``wait_all()`` equals ``all_gather_into_tensor``.
    """
    p = comm.group_size(group)
    m = x.shape[0]
    x = x.contiguous()
    out = torch.empty(p * m, *x.shape[1:], dtype=x.dtype, device=x.device)
    spans: list[tuple[int, int]] = []
    handles: list[Handle] = []
    bufs: list[torch.Tensor] = []
    lo = 0
    for sz in chunk_sizes(m, chunks):
        spans.append((lo, lo + sz))
        buf = torch.empty(p * sz, *x.shape[1:], dtype=x.dtype, device=x.device)
        handles.append(comm.all_gather_into(buf, x[lo : lo + sz], group=group) if sz else Handle.completed())
        bufs.append(buf)
        lo += sz

    def finish(i: int) -> None:
        a, b = spans[i]
        if b > a:
            out.view(p, m, *x.shape[1:])[:, a:b].copy_(bufs[i].view(p, b - a, *x.shape[1:]))

    return Partitioned(out, handles, spans, finish)


def partitioned_reduce_scatter(x: torch.Tensor, group: ProcessGroup | None = None, chunks: int | Sequence[float] = 2) -> Partitioned:
    """Reduce-scatter (sum) along dim 0 issued as pieces (Centauri §3.1.3); ``wait_all()`` equals the flat one.

    ``x``: ``[P*m, ...]``; piece i reduces rows ``spans[i]`` of every rank's block.
    """
    p = comm.group_size(group)
    if x.shape[0] % p:
        raise ValueError(f"partitioned_reduce_scatter: dim 0 ({x.shape[0]}) not divisible by {p}")
    m, rest = x.shape[0] // p, x.shape[1:]
    x3 = x.reshape(p, m, *rest)
    out = torch.empty(m, *rest, dtype=x.dtype, device=x.device)
    spans: list[tuple[int, int]] = []
    handles: list[Handle] = []
    lo = 0
    for sz in chunk_sizes(m, chunks):
        spans.append((lo, lo + sz))
        if sz:
            piece = x3[:, lo : lo + sz].contiguous().view(p * sz, *rest)
            handles.append(comm.reduce_scatter_into(out[lo : lo + sz], piece, group=group))
        else:
            handles.append(Handle.completed())
        lo += sz
    return Partitioned(out, handles, spans)


def partitioned_all_reduce(t: torch.Tensor, group: ProcessGroup | None = None, chunks: int | Sequence[float] = 2) -> Partitioned:
    """All-reduce (sum) of ``t`` (along dim 0 pieces) issued asynchronously (Centauri §3.1.3); returns a new tensor."""
    out = t.contiguous().clone()
    spans: list[tuple[int, int]] = []
    handles: list[Handle] = []
    lo = 0
    for sz in chunk_sizes(t.shape[0], chunks):
        spans.append((lo, lo + sz))
        handles.append(comm.all_reduce(out[lo : lo + sz], group=group) if sz else Handle.completed())
        lo += sz
    return Partitioned(out, handles, spans)
