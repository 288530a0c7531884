"""Shape agreement across ranks: the same clear error on every rank instead of a hang.

A collective with mismatched shapes hangs (NCCL) or aborts the process (gloo). Before an
op runs, each rank writes a fixed-length integer descriptor of its arguments (op id, the
shapes, the dtypes, and the result of its *local* checks); one small all-gather gives every
rank the whole table, and the same pure-Python rules run on that table on every rank, so
either every rank proceeds or every rank raises :class:`ShapeMismatchError` with the very
same message (naming the ranks and shapes that disagree).

The check runs on **every call** by default (``"always"``): a mismatch that appears only on
a later call (a shape that changes on one rank, a schedule or comm engine switched on one
rank) would otherwise abort a gloo rank or let a collective read the wrong number of bytes
and return garbage. It costs one all-gather of 64 int64 per call (512 bytes per rank); on
NCCL the descriptor travels over a gloo group of the same ranks (created once, for the
default group), so the check needs no GPU sync. ``ccoverlap bench`` shows its cost next to
the serial time. ``"first"`` (the first call of each op on each process group in this
process) and ``"never"`` are opt-outs for a caller that can prove its arguments agree; they
are not safe against a mismatch on a later call. The policy must be the same on every rank.
Caching on the *local shape* is deliberately not offered: a rank that has seen its shape
before would skip the check while a rank with a new (wrong) shape would run it, and that
mismatch is itself a hang. Set it with :func:`set_shape_check`, the ``check_shapes=``
argument of the ops, or the environment variable ``CCOVERLAP_CHECK_SHAPES``.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ccoverlap.errors import ConfigError
from ccoverlap.runtime import comm

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "ShapeMismatchError", "set_shape_check", "get_shape_check", "agree", "agree_start", "Agreement", "TensorDesc",
    "dtype_code", "dtype_name",
]  # fmt: skip

_MODES = ("always", "first", "never")
_MAX_DIMS = 8
_SLOT = 2 + _MAX_DIMS  # present, ndim, dims...
_lock = threading.Lock()
_mode = os.environ.get("CCOVERLAP_CHECK_SHAPES", "always")
_host_groups: dict[int, ProcessGroup | None] = {}
_seen: set[tuple[str, int]] = set()
_WIDTH = 64  # full descriptor length (int64) in the slow path
#: Exchange a fingerprint first (True) or always the full descriptor table (False, the first
#: version; kept so benchmarks/bench_runtime_check.py can compare). Must be equal on every rank.
FINGERPRINT_FIRST = True


class ShapeMismatchError(ConfigError):
    """Arguments of a distributed op disagree across ranks (raised identically on all ranks)."""


def set_shape_check(mode: str) -> str:
    """Set the process-wide shape-check policy (``always`` | ``first`` | ``never``); returns the old one."""
    global _mode
    if mode not in _MODES:
        raise ValueError(f"set_shape_check: mode must be one of {_MODES}, got {mode!r}")
    with _lock:
        old, _mode = _mode, mode
        _seen.clear()
    return old


def get_shape_check() -> str:
    """The current process-wide shape-check policy."""
    return _mode


class TensorDesc:
    """Shape and dtype of one argument as written into the descriptor."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: torch.dtype) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype


def _should_check(op: str, group: ProcessGroup | None, mode: str | None) -> bool:
    mode = mode or _mode
    if mode not in _MODES:
        raise ValueError(f"check_shapes must be one of {_MODES}, got {mode!r}")
    if mode == "never":
        return False
    if mode == "always":
        return True
    key = (op, id(group) if group is not None else 0)
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    return True


def agree(
    op: str,
    group: ProcessGroup | None,
    tensors: Mapping[str, torch.Tensor | TensorDesc],
    *,
    ints: Mapping[str, int] | None = None,
    rules: Sequence[Rule],
    mode: str | None = None,
) -> Table | None:
    """Check that ``tensors``/``ints`` satisfy ``rules`` on every rank; raise the same error on all.

    ``tensors`` maps argument names to tensors (shape and dtype are used); ``ints`` adds
    scalar parameters. ``rules`` are callables ``rule(table) -> str | None`` run on the
    gathered :class:`Table`; the first message returned becomes the error, prefixed by ``op``.
    Skipped (no communication) according to the shape-check policy. Returns the gathered
    table (the same on every rank) so the caller can derive agreed values from it, or None
    when the check was skipped.
    """
    return agree_start(op, group, tensors, ints=ints, rules=rules, mode=mode).result()


class Agreement:
    """A cross-rank check in flight (:func:`agree_start`): :meth:`result` finishes it.

    Between the two, a caller may run *local* work (a GEMM that needs no communication)
    while the fingerprint travels; it must not start any other collective on the group
    before :meth:`result` returns, and it must call :meth:`result` on every rank.
    """

    __slots__ = ("_op", "_group", "_row", "_names", "_int_names", "_rules", "_handle", "_fps", "_done", "_table")

    def __init__(
        self, op: str, group: ProcessGroup | None, row: list[int] | None, names: Sequence[str],
        int_names: Sequence[str], rules: Sequence[Rule], handle: comm.Handle | None, fps: torch.Tensor | None,
    ) -> None:  # fmt: skip
        self._op, self._group, self._row, self._names, self._int_names = op, group, row, names, int_names
        self._rules, self._handle, self._fps = rules, handle, fps
        self._done: bool = row is None
        self._table: Table | None = None

    def result(self) -> Table | None:
        """Wait for the check; the gathered :class:`Table`, or None when it was skipped.

        Raises :class:`ShapeMismatchError` (the same message on every rank) when a rule fails.
        """
        if self._done:
            return self._table
        self._done = True
        assert self._row is not None  # a skipped check (no row) is done from the start
        op, row, names, int_names, rules = self._op, self._row, self._names, self._int_names, self._rules
        p = comm.group_size(self._group)
        fp = _fingerprint(row)
        if self._handle is not None and self._fps is not None:
            self._handle.wait()
            fps_l = self._fps.tolist() if self._fps.device.type == "cpu" else self._fps.cpu().tolist()
            if all(f == fp for f in fps_l):
                table, msg = _evaluate(op, [list(row)] * p, names, int_names, rules)
                if msg:
                    raise ShapeMismatchError(msg)
                self._table = table
                return table
        # Slow path: the full descriptors, padded to a fixed width so that the gather itself can
        # never mismatch (descriptors of different ops have different lengths).
        cgroup = _check_group(self._group)
        dev = comm.comm_device(cgroup)
        padded = torch.full((_WIDTH,), -7, dtype=torch.int64)
        padded[: len(row)] = torch.tensor(row, dtype=torch.int64)
        table_t = torch.empty(p * _WIDTH, dtype=torch.int64, device=dev)
        comm.all_gather_into(table_t, padded.to(dev), group=cgroup, async_op=False)
        raw = table_t.view(p, _WIDTH).cpu().tolist()
        table, msg = _evaluate(op, raw, names, int_names, rules)
        if msg:
            raise ShapeMismatchError(msg)
        self._table = table
        return table


def agree_start(
    op: str,
    group: ProcessGroup | None,
    tensors: Mapping[str, torch.Tensor | TensorDesc],
    *,
    ints: Mapping[str, int] | None = None,
    rules: Sequence[Rule],
    mode: str | None = None,
) -> Agreement:
    """Start the check of :func:`agree` (its first, fingerprint collective, asynchronously).

    Returns an :class:`Agreement`; its ``result()`` waits, runs the rules and returns what
    :func:`agree` returns. Collective (unless the policy skips it).
    """
    if (comm.group_size(group) == 1 and not rules) or not _should_check(op, group, mode):
        return Agreement(op, group, None, (), (), (), None, None)
    names = list(tensors)
    int_names = list(ints or {})
    row: list[int] = [_op_id(op), len(names), len(int_names)]
    for name in names:
        t = tensors[name]
        shape, dtype = tuple(t.shape), t.dtype
        if len(shape) > _MAX_DIMS:
            shape = shape[:_MAX_DIMS]
        row += [1, len(t.shape), *shape, *([-1] * (_MAX_DIMS - len(shape)))]
        row.append(dtype_code(dtype))
    row += [int(v) for v in (ints or {}).values()]
    if len(row) > _WIDTH:
        raise ValueError(f"{op}: too many arguments for the shape check")
    handle: comm.Handle | None = None
    fps: torch.Tensor | None = None
    if FINGERPRINT_FIRST:
        # Fast path: one all-gather of a 64-bit fingerprint of the descriptor (8 bytes per rank).
        # When every rank's fingerprint is equal, every rank holds the same descriptor, so each
        # can build the whole table from its own row and run the rules locally: the outcome is the
        # same everywhere (the rules are pure functions of the table).
        # When any fingerprint differs (a mismatch, or a legitimately per-rank field such as
        # out_features or DMA availability), every rank sees that in the same gathered list and all
        # of them fall back to gathering the full descriptors.
        cgroup = _check_group(group)
        dev = comm.comm_device(cgroup)
        fps = torch.empty(comm.group_size(group), dtype=torch.int64, device=dev)
        mine = torch.tensor([_fingerprint(row)], dtype=torch.int64).to(dev)
        handle = comm.all_gather_into(fps, mine, group=cgroup, async_op=True)
    return Agreement(op, group, row, names, int_names, rules, handle, fps)


def _name_of(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_code(dtype: torch.dtype) -> int:
    """A stable non-negative 31-bit code for any torch dtype: a blake2b hash of its name.

    Every dtype gets its own code (complex, every float8 variant, bool, the unsigned and
    sub-byte integers, ...), and the code does not depend on a table or on the torch
    version, so two ranks with different dtypes always write different descriptors.
    """
    digest = hashlib.blake2b(_name_of(dtype).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _known_dtypes() -> dict[int, str]:
    names = {_name_of(v) for v in vars(torch).values() if isinstance(v, torch.dtype)}
    return {dtype_code(getattr(torch, n)): n for n in sorted(names)}


_DTYPE_NAMES = _known_dtypes()


def dtype_name(code: int) -> str:
    """The dtype name a :func:`dtype_code` stands for (``dtype#<code>`` for a dtype this torch lacks)."""
    return _DTYPE_NAMES.get(code, f"dtype#{code}")


def _fingerprint(row: list[int]) -> int:
    """A stable signed 64-bit hash of a descriptor row (blake2b; the same on every process)."""
    digest = hashlib.blake2b(struct.pack(f"<{len(row)}q", *row), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _evaluate(
    op: str, raw: list[list[int]], names: Sequence[str], int_names: Sequence[str], rules: Sequence[Rule]
) -> tuple[Table | None, str | None]:
    """Run the rules on the gathered rows: ``(table, None)`` or ``(None, message)`` (pure)."""
    if any(r[0] != raw[0][0] for r in raw):
        ops = {i: _OP_NAMES.get(r[0], f"op#{r[0]}") for i, r in enumerate(raw)}
        return None, f"ranks are calling different distributed ops ({_fmt_ranks(ops)})"
    table = Table(raw, names, int_names)
    for rule in rules:
        msg = rule(table)
        if msg:
            return None, f"{op}: {msg}"
    return table, None


def _check_group(group: ProcessGroup | None) -> ProcessGroup | None:
    """The group the descriptor travels on: a gloo twin of the default group under NCCL.

    A gloo all-gather of 512 bytes needs no CUDA sync, so the check does not stall the
    GPU stream. Only the default group gets a twin (``new_group`` must be called by every
    process of the world, which holds for the default group's first op call on all ranks);
    subgroups use their own backend.
    """
    import torch.distributed as dist

    if "nccl" not in comm.backend_of(group):
        return group
    if group is not None and group is not dist.GroupMember.WORLD:
        return group
    with _lock:
        twin = _host_groups.get(0)
    if twin is None:
        try:
            twin = dist.new_group(backend="gloo")
        except Exception:  # noqa: BLE001 - no gloo in this build: use the device group
            twin = group
        with _lock:
            _host_groups[0] = twin
    return twin


def same_int(name: str, render: Callable[[int], object] = str, what: str | None = None) -> Rule:
    """Rule: integer parameter ``name`` equals rank 0's on every rank (``render`` names the value)."""

    def rule(t: Table) -> str | None:
        vals = t.ints(name)
        for r, v in enumerate(vals):
            if v != vals[0]:
                return f"rank {r}: {what or name}={render(v)} but rank 0 has {render(vals[0])}"
        return None

    return rule


class Table:
    """Every rank's descriptor, decoded: ``shape(name, rank)``, ``dtype(name, rank)``, ``int(name, rank)``."""

    def __init__(self, raw: list[list[int]], names: Sequence[str], int_names: Sequence[str]) -> None:
        self.world_size = len(raw)
        self._shapes: dict[str, list[tuple[int, ...]]] = {n: [] for n in names}
        self._dtypes: dict[str, list[str]] = {n: [] for n in names}
        self._ints: dict[str, list[int]] = {n: [] for n in int_names}
        for r in raw:
            pos = 3
            for n in names:
                ndim = r[pos + 1]
                dims = r[pos + 2 : pos + 2 + min(ndim, _MAX_DIMS)]
                self._shapes[n].append(tuple(dims))
                code = r[pos + _SLOT]
                self._dtypes[n].append(dtype_name(code))
                pos += _SLOT + 1
            for n in int_names:
                self._ints[n].append(r[pos])
                pos += 1

    def shape(self, name: str, rank: int) -> tuple[int, ...]:
        """Shape of argument ``name`` on ``rank``."""
        return self._shapes[name][rank]

    def shapes(self, name: str) -> list[tuple[int, ...]]:
        """Shapes of argument ``name`` on every rank, by rank."""
        return list(self._shapes[name])

    def dtypes(self, name: str) -> list[str]:
        """Dtype names of argument ``name`` on every rank, by rank."""
        return list(self._dtypes[name])

    def ints(self, name: str) -> list[int]:
        """Integer parameter ``name`` on every rank, by rank."""
        return list(self._ints[name])


#: A rule of the check: a pure function of the gathered table, an error message or None.
Rule = Callable[[Table], "str | None"]


# ----------------------------------------------------------------------------- rule helpers
def _fmt_ranks(values: Mapping[int, object]) -> str:
    return ", ".join(f"rank {r}: {v}" for r, v in values.items())


def _fmt_shape(s: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in s) + ")"


def same_across_ranks(
    name: str, what: str, pick: Callable[[tuple[int, ...]], object] = lambda s: s
) -> Rule:
    """Rule: ``pick(shape)`` of argument ``name`` is equal on every rank."""

    def rule(t: Table) -> str | None:
        vals = [pick(s) for s in t.shapes(name)]
        if any(v != vals[0] for v in vals):
            shown = {r: (_fmt_shape(v) if isinstance(v, tuple) else v) for r, v in enumerate(vals)}
            return f"{what} must be the same on every rank, got {_fmt_ranks(shown)}"
        return None

    return rule


def same_dtype(*names: str) -> Rule:
    """Rule: the named arguments share one dtype, on every rank."""

    def rule(t: Table) -> str | None:
        for r in range(t.world_size):
            ds = {t.dtypes(n)[r] for n in names}
            if len(ds) != 1:
                return f"dtypes differ on rank {r}: " + ", ".join(f"{n}={t.dtypes(n)[r]}" for n in names)
        for n in names:
            per = t.dtypes(n)
            if any(d != per[0] for d in per):
                return f"{n} dtype must be the same on every rank, got {_fmt_ranks(dict(enumerate(per)))}"
        return None

    return rule


def per_rank(check: Callable[[Table, int], str | None]) -> Rule:
    """Rule: ``check(table, rank) -> str | None`` must pass on every rank (reports the first)."""

    def rule(t: Table) -> str | None:
        for r in range(t.world_size):
            msg = check(t, r)
            if msg:
                return f"rank {r}: {msg}"
        return None

    return rule


def _op_id(op: str) -> int:
    # a stable small id (no hash randomisation): sum of code points times position
    return sum((i + 1) * ord(c) for i, c in enumerate(op)) % 1_000_003


# Names every rank can decode (the table must produce the same message everywhere).
_KNOWN_OPS = (
    "all_gather_matmul", "matmul_reduce_scatter", "all_to_all_matmul",
    "all_gather_matmul.tune", "matmul_reduce_scatter.tune", "sequence all-gather",
)  # fmt: skip
_OP_NAMES: dict[int, str] = {_op_id(n): n for n in _KNOWN_OPS}
