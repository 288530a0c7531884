"""Overlap per parallelism dimension: which of TP / DP (FSDP) / PP / EP / CP the communication belongs to.

Every communication row carries its process group (:mod:`.classify`: ``Process Group Name`` of
the collective record, else the job's only group; for gloo traces on CPU, see
:func:`choose_cpu_groups`). A group is mapped to a dimension by, in order:

1. ``--groups FILE``: a JSON object whose keys are a group name (``"3"``), a group description
   (``"mesh_tp"``) or ``"ranks:0,1"`` and whose values are the dimension (any label; ``TP``, ``DP``,
   ``FSDP``, ``PP``, ``EP``, ``CP`` are the usual ones);
2. the description PyTorch records for the group (``distributedInfo.pg_config[].pg_desc``, or the
   collective record's ``Process Group Description``): DeviceMesh names groups ``mesh_<dim>``
   (torchtitan: ``mesh_tp``, ``mesh_dp_shard``, ``mesh_dp_replicate``, ``mesh_pp``, ``mesh_cp``,
   ``mesh_ep``), Megatron-style names contain ``tensor`` / ``data`` / ``pipeline`` / ``expert`` /
   ``context``;
3. the group covering every rank of the job (``default_pg``) is ``world``; a group whose
   description says nothing is ``group <name>``.

Per dimension and rank: **time** = length of the union of the dimension's communication
intervals, **exposed** = the part of it during which no compute runs, **overlap** = time −
exposed (ratio = overlap / time, HTA's definition restricted to that dimension), **bytes**, and
``algbw`` = Σ bytes / Σ call durations (nccl-tests' algorithm bandwidth; calls with a known size).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ccoverlap.config import short, suggest
from ccoverlap.errors import ConfigError
from ccoverlap.outputs import path_name
from ccoverlap.sim.timeline import merge_intervals
from ccoverlap.trace.classify import RankTrace
from ccoverlap.trace.contention import covered_length

# (regex on the lower-cased description or name, dimension); first match wins
_DESC_PATTERNS = (
    (r"(^|[^a-z])(dp_shard|fsdp|shard)", "FSDP"),
    (r"(^|[^a-z])(pp|pipe|pipeline|stage)([^a-z]|$)", "PP"),
    (r"(^|[^a-z])(ep|expert|moe)([^a-z]|$)", "EP"),
    (r"(^|[^a-z])(cp|context|ring|sp|sequence)([^a-z]|$)", "CP"),
    (r"(^|[^a-z])(tp|tensor)([^a-z]|$)", "TP"),
    (r"(^|[^a-z])(dp|data|replicate|ddp|dp_replicate|hsdp)([^a-z]|$)", "DP"),
)
KNOWN_DIMENSIONS = ("TP", "DP", "FSDP", "PP", "EP", "CP")


def load_groups(path: str | Path) -> dict[str, str]:
    """Read a ``--groups`` file: a JSON object ``{group name | description | "ranks:0,1": dimension}``."""
    p = Path(path)
    name = path_name(p)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"--groups {name}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ConfigError(f"--groups {name}: not valid JSON ({exc})") from None
    return check_groups(doc, f"--groups {name}", kind="JSON object")


def check_groups(groups: Any, where: str = "groups", kind: str = "non-empty mapping") -> dict[str, str]:
    """``groups`` (process group -> dimension, as a ``--groups`` file holds) with keys as text
    and names stripped; ConfigError naming ``where`` unless it is a non-empty mapping (``kind``
    in the message) of non-empty names."""
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(f"{where}: expected a {kind} like {{\"mesh_tp\": \"TP\", \"1\": \"DP\"}}, "
                          f"got {short(groups)}")
    out = {}
    for k, v in groups.items():
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(f"{where}: the dimension of {short(k)} must be a non-empty string, got {short(v)}")
        out[str(k)] = v.strip()
    return out


def dimension_of(group: str, entry: dict | None, world: int | None, mapping: dict[str, str] | None = None
                 ) -> tuple[str, str]:
    """``(dimension, how)`` of one process group (see the module docstring for the order)."""
    entry = entry or {}
    desc = str(entry.get("desc") or "")
    ranks = entry.get("ranks")
    if mapping:
        if group in mapping:
            return mapping[group], "--groups (name)"
        if desc and desc in mapping:
            return mapping[desc], "--groups (description)"
        if isinstance(ranks, list):
            key = "ranks:" + ",".join(str(r) for r in ranks)
            if key in mapping:
                return mapping[key], "--groups (ranks)"
    text = desc.lower()
    if text and text not in ("undefined", "default_pg"):
        for pat, dim in _DESC_PATTERNS:
            if re.search(pat, text):
                return dim, f"description {desc!r}"
    size = entry.get("size") or (len(ranks) if isinstance(ranks, list) else 0)
    if text == "default_pg" or (world and size == world):
        return "world", "group of every rank"
    return f"group {group}", "no description"


@dataclass
class DimensionStats:
    """One parallelism dimension over the analysed window. Times in seconds (summed over ranks),
    bytes, bandwidth in bytes/s."""

    dimension: str
    how: str
    groups: list[str]
    calls: int
    ranks: int
    time_s: float
    exposed_s: float
    overlap_s: float
    overlap_ratio: float
    bytes_total: float
    algbw: float | None
    collectives: list[str] = field(default_factory=list)
    per_rank: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain dict for JSON."""
        d = asdict(self)
        d["per_rank"] = {str(k): v for k, v in self.per_rank.items()}
        return d


def rank_dimension_parts(rt: RankTrace, mask: np.ndarray, mapping: dict[str, str] | None = None,
                         compute: tuple[np.ndarray, np.ndarray] | None = None) -> list[dict]:
    """One rank's share of :func:`combine_dimension_parts`: per dimension its communication time (union),
    exposed part, calls, bytes and collectives. ``compute``: the rank's merged compute intervals
    (computed here when not given)."""
    tl = rt.timeline
    pg = rt.meta.get("pg_config") or {}
    world = rt.meta.get("world_size")
    m = mask & (tl.kind == "comm")
    if compute is None:
        comp = mask & (tl.kind == "compute")
        compute = merge_intervals(tl.start_s[comp], tl.end_s[comp])
    cs, ce = compute
    idx = np.flatnonzero(m)
    if not len(idx):
        return []
    dims = {}
    groups_l = tl.group[idx].tolist()
    for g in sorted(set(groups_l)):         # np.unique's order, without sorting a string per row
        dims[g] = dimension_of(str(g), pg.get(str(g)), world, mapping)
    row_dim_l = [dims[g][0] for g in groups_l]
    row_dim = np.array(row_dim_l, dtype=object)
    parts = []
    for dim in sorted(set(row_dim_l)):
        rows = idx[row_dim == dim]
        us, ue = merge_intervals(tl.start_s[rows], tl.end_s[rows])
        t = float(np.sum(ue - us))
        covered = float(np.sum(covered_length(cs, ce, us, ue))) if len(us) else 0.0
        d = tl.end_s[rows] - tl.start_s[rows]
        b = tl.bytes[rows]
        known = b > 0
        groups = set(tl.group[rows].tolist())
        parts.append({"dimension": dim, "groups": sorted(str(g) for g in groups),
                      "how": sorted({dims[g][1] for g in groups}), "calls": int(len(rows)), "time": t,
                      "covered": covered, "bytes": float(b[known].sum()), "bytes_known_time": float(d[known].sum()),
                      "colls": sorted({str(c) or "unknown" for c in tl.collective[rows].tolist()})})
    return parts


def combine_dimension_parts(parts_by_rank: list[tuple[int, list[dict]]]) -> list[DimensionStats]:
    """:class:`DimensionStats` per dimension from every rank's :func:`rank_dimension_parts` (in rank order)."""
    acc: dict[str, dict] = {}
    for rank, parts in parts_by_rank:
        for p in parts:
            t, covered = p["time"], p["covered"]
            a = acc.setdefault(p["dimension"], {"how": set(), "groups": set(), "calls": 0, "time": 0.0, "exposed": 0.0,
                                                "bytes": 0.0, "bytes_known_time": 0.0, "colls": set(), "per_rank": {}})
            a["groups"].update(p["groups"])
            a["how"].update(p["how"])
            a["calls"] += p["calls"]
            a["time"] += t
            a["exposed"] += t - covered
            a["bytes"] += p["bytes"]
            a["bytes_known_time"] += p["bytes_known_time"]
            a["colls"].update(p["colls"])
            a["per_rank"][rank] = {"time_s": t, "exposed_s": t - covered, "overlap_s": covered,
                                   "overlap_ratio": covered / t if t > 0 else 0.0, "calls": p["calls"]}
    out = []
    for dim, a in acc.items():
        t = a["time"]
        out.append(DimensionStats(
            dimension=dim, how=", ".join(sorted(a["how"])), groups=sorted(a["groups"]), calls=a["calls"],
            ranks=len(a["per_rank"]), time_s=t, exposed_s=a["exposed"], overlap_s=t - a["exposed"],
            overlap_ratio=(t - a["exposed"]) / t if t > 0 else 0.0, bytes_total=a["bytes"],
            algbw=a["bytes"] / a["bytes_known_time"] if a["bytes_known_time"] > 0 else None,
            collectives=sorted(a["colls"]), per_rank=a["per_rank"]))
    out.sort(key=lambda s: -s.exposed_s)
    return out


# ----------------------------------------------------------------------------- gloo on CPU

#: One gloo worker-thread family's calls: (member thread labels, ends_s, durations_s, type/size
#: labels, current group).
ThreadCalls = tuple[list[str], np.ndarray, np.ndarray, np.ndarray, str]


def cpu_thread_calls(rt: RankTrace) -> dict[str, ThreadCalls]:
    """The gloo calls of each worker-thread family of a CPU-mode rank (what :func:`choose_cpu_groups`
    matches across ranks): ``{first thread's label: (member labels, ends_s, durations_s, type/size
    labels, current group)}``."""
    tl = rt.timeline
    comm = np.flatnonzero(tl.kind == "comm")
    per: dict[str, ThreadCalls] = {}
    for th, members in _thread_families(np.unique(tl.stream[comm]).tolist()).items():
        rows = comm[np.isin(tl.stream[comm], members)]
        kind = np.array([f"{c}/{b:.0f}" for c, b in zip(tl.collective[rows].tolist(), tl.bytes[rows].tolist())],
                        dtype=object)      # same collective and same size
        per[th] = (members, tl.end_s[rows], tl.end_s[rows] - tl.start_s[rows], kind, str(tl.group[rows[0]]))
    return per


def choose_cpu_groups(threads: dict[int, dict[str, ThreadCalls]],
                      info: dict[int, tuple[dict[str, dict[str, Any]], int | None, str]], tolerance: float = 0.25
                      ) -> tuple[dict[int, dict[str, str]], list[str]]:
    """The process group of each gloo thread family, rank by rank.

    A gloo trace names no group on its ``gloo:*`` ops, but each ProcessGroupGloo runs its
    collectives on its own worker threads, and a collective ends at about the same moment on
    every member of its group. So each worker thread of rank r is matched to the group of
    ``pg_config`` (those containing r, the all-ranks group last) whose other members have a
    thread whose collectives of the same type and size end together with this thread's: score =
    share of the thread's calls with a partner call ending within ``tolerance`` × its duration
    (at least 50 µs), ties broken by the closer ends. A ProcessGroupGloo starts its worker
    threads (2 by default) one after the other, so threads with consecutive ids are taken as one
    group's and matched together. Needs ≥ 2 ranks with ``pg_config``; a heuristic - ``--groups``
    cannot override it, and NCCL traces do not need it (their collective records name the group).

    ``threads[rank]``: :func:`cpu_thread_calls` of that rank (ends on the job's clock);
    ``info[rank]``: ``(pg_config, world_size, path)``. Returns ``({rank: {family: group}}, notes)``
    (one note per thread left unassigned); :func:`apply_cpu_groups` gives a rank its groups.
    """
    chosen: dict[int, dict[str, str]] = {}
    notes: list[str] = []
    for rank in threads:
        pg, world, path = info[rank]
        cands = [(name, e) for name, e in pg.items()
                 if isinstance(e.get("ranks"), list) and rank in e["ranks"] and len(e["ranks"]) > 1]
        if len(cands) <= 1:
            continue
        cands.sort(key=lambda ne: len(ne[1]["ranks"]) == world)     # the all-ranks group last
        for th, (_, ends, durs, colls, current) in threads[rank].items():
            best, best_key = None, (0.0, 0.0)
            for name, e in cands:
                others = [q for q in e["ranks"] if q != rank and q in threads]
                if not others:
                    continue
                # per member: its best-matching thread (share matched, then closeness); the group's
                # score is its weakest member's
                key = min(max((_match(ends, durs, colls, *threads[q][u][1:4], tolerance) for u in threads[q]),
                              default=(0.0, 0.0)) for q in others)
                if key > best_key:
                    best, best_key = name, key
            if best is not None and best_key[0] >= 0.5:
                chosen.setdefault(rank, {})[th] = best
            else:
                notes.append(f"{path}: gloo thread {th!r}: no process group of pg_config matches its "
                             f"collectives across ranks - left in group {current!r}")
    return chosen, notes


def apply_cpu_groups(rt: RankTrace, chosen: dict[str, str]) -> None:
    """Put the gloo calls of each thread family of ``rt`` into its chosen group (sizes scaled by a
    guessed group size are rescaled)."""
    tl = rt.timeline
    pg = rt.meta.get("pg_config") or {}
    comm = np.flatnonzero(tl.kind == "comm")
    families = _thread_families(np.unique(tl.stream[comm]).tolist())
    for th, best in chosen.items():
        if th not in families or best not in pg:
            continue
        rows = comm[np.isin(tl.stream[comm], families[th])]
        tl.group[rows] = best
        n_new = len(pg[best]["ranks"])
        if rt.size_source is not None:      # sizes scaled by a guessed group size: rescale
            scaled = rows[(rt.size_source[rows] == "op input x group size") & (rt.group_size[rows] > 0)]
            tl.bytes[scaled] *= n_new / rt.group_size[scaled]
        rt.group_size[rows] = n_new


_TID = re.compile(r"thread (\d+)")


def _thread_families(labels: list[str]) -> dict[str, list[str]]:
    """Threads with consecutive numeric ids (``thread 13623 (...)``) grouped under the first one's label."""
    num: list[tuple[int, str]] = []
    out: dict[str, list[str]] = {}
    for lab in labels:
        m = _TID.search(str(lab))
        if m:
            num.append((int(m.group(1)), lab))
        else:
            out[lab] = [lab]
    num.sort()
    prev = None
    head = ""               # set by the first numbered thread (prev is None then)
    for tid, lab in num:
        if prev is None or tid != prev + 1:
            head = lab
            out[head] = []
        out[head].append(lab)
        prev = tid
    return out


def _match(ends: np.ndarray, durs: np.ndarray, colls: np.ndarray, ends2: np.ndarray, durs2: np.ndarray,
           colls2: np.ndarray, tolerance: float) -> tuple[float, float]:
    """(share of calls with a same-type call in the other list ending within tolerance,
    minus the mean |end difference| of those matches in seconds): larger is a better match."""
    if not len(ends) or not len(ends2):
        return (0.0, 0.0)
    order = np.argsort(ends2)
    e2 = ends2[order]
    c2 = colls2[order]
    tol = np.maximum(durs * tolerance, 50e-6)
    pos = np.searchsorted(e2, ends)
    hits = 0
    gap = 0.0
    for k in range(len(ends)):
        best = None
        for p in (pos[k] - 1, pos[k]):
            if 0 <= p < len(e2) and c2[p] == colls[k]:
                d = abs(e2[p] - ends[k])
                if d <= tol[k] and (best is None or d < best):
                    best = d
        if best is not None:
            hits += 1
            gap += best
    return (hits / len(ends), -gap / hits if hits else 0.0)


def check_group_keys(mapping: dict[str, str], ranks: list, seen: set[str], where: str = "--groups") -> None:
    """ConfigError naming the first key of ``mapping`` (a ``--groups`` file) that matches no
    process group of the job: not a group name among ``seen`` (the groups of the analysed
    communication) or the ranks' ``pg_config``, nor one of their descriptions, nor their
    ``ranks:a,b`` key; with the closest known key and the known ones. A key that matches
    nothing would otherwise be ignored without a word."""
    known: set[str] = {str(g) for g in seen}
    for r in ranks:
        for name, entry in ((getattr(r, "meta", None) or {}).get("pg_config") or {}).items():
            known.add(str(name))
            if isinstance(entry, dict):
                if entry.get("desc"):
                    known.add(str(entry["desc"]))
                if isinstance(entry.get("ranks"), list):
                    known.add("ranks:" + ",".join(str(x) for x in entry["ranks"]))
    unknown = [k for k in mapping if k not in known]
    if unknown:
        listed = sorted(known)
        shown = ", ".join(short(k) for k in listed[:12]) + (f", ... ({len(listed)} in all)" if len(listed) > 12 else "")
        raise ConfigError(f"{where}: {short(unknown[0])} matches no process group of these traces"
                          f"{suggest(unknown[0], listed)}; known: {shown or 'none (no group recorded)'}")
