"""The dependency graph of a measured step, rebuilt from one Kineto trace per rank.

Nodes (times in seconds from the job's origin, as :mod:`ccoverlap.trace.classify` sets it):

* every **device event** of the rank (kernel, memcpy, memset, sync) - a GPU op with its
  measured duration;
* every **CUDA runtime / driver call** that carries a correlation id (``cudaLaunchKernel``,
  ``cudaMemcpyAsync``, ``cudaEventRecord``, ``cudaStreamWaitEvent``, ``cuda*Synchronize``) -
  a CPU call on its thread with its measured duration;
* per blocking call (``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` /
  ``cudaEventSynchronize``, and a memcpy call that returned only after its copy ended) a
  zero-length *wait* node: the call returns at ``max(start + own cost, target end + return
  latency)``;
* per collective matched across ranks a *barrier* (the latest member start) and per member
  an *end* node (barrier + the member's measured transfer time, ``end_r - max_m start_m``):
  a collective ends when its slowest member allows.

Edges ``t[dst] >= t[src] (+ dur[src] when from_end) + w`` (the usual longest-path rule):

* **CPU order**: consecutive calls of one thread, separated by the measured gap (the CPU
  operator work between two calls is a fixed time);
* **launch**: a call to its device op (correlation id), latency = the rank's median
  launch-to-start latency of launch-bound ops (``flow``: the id Kineto's ``ac2g`` flow
  arrows carry, the same correlation id);
* **stream order**: consecutive ops of one (device, stream);
* **cross-stream**: from ``cuda_sync`` events' ``wait_on_stream`` /
  ``wait_on_cuda_event_record_corr_id`` when Kineto wrote them (recent PyTorch with
  ``enable_cuda_sync_events``); otherwise *inferred from timing*: an op that started later
  than its launch, its stream and its known dependencies allow (by more than ``tol_s``)
  depends on the op of another stream of the device that ended last before it started;
* **host sync**: target op(s) to a blocking call's wait node (device sync: the last op of
  every stream launched before the call; stream / event sync without args: the op launched
  before the call that ended last before it returned - timing inference);
* **launch queue**: a launch / memcpy / memset call that took > 50 µs and > 10x its name's
  median and returned within 10 µs after an op (launched before it) ended waited for a slot in
  CUDA's launch queue (the GPU was behind the CPU): it returns when that op ends;
* **collective**: member starts to the barrier, barrier to each member's end node.

The weight of the binding constraint of each node (the one with the latest measured time) is
set so the unedited graph reproduces the measured start; the other constraints keep their
nominal weight (0 gap, median launch latency), so an edit that moves a predecessor moves its
successors as far as the structure says. This is trace-driven replay as in Lumos (Liang et al.,
MLSys 2025); the implementation is ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ccoverlap.trace.classify import RankTrace
from ccoverlap.trace.load import DEVICE_CAT_LIST, RawTrace

# node kinds
GPU, CPU, WAIT, BARRIER, CEND = 0, 1, 2, 3, 4
_SYNC_CAT = DEVICE_CAT_LIST.index("cuda_sync")
_SYNC_NAMES = ("Synchronize",)
_DEVICE_SYNC = ("cudaDeviceSynchronize", "hipDeviceSynchronize", "cudaCtxSynchronize", "cuCtxSynchronize")


@dataclass
class RankGraph:
    """One rank's part of the graph (local node ids), before ranks are joined."""

    rank: int
    rt: RankTrace
    raw: RawTrace
    n_gpu: int
    n_cpu: int
    # per node (GPU ops first, then CPU calls, then wait nodes)
    kind: list = field(default_factory=list)
    dur: list = field(default_factory=list)
    start: list = field(default_factory=list)        # measured start (s)
    release: list = field(default_factory=list)      # earliest start of a root (None: none)
    # edges
    src: list = field(default_factory=list)
    dst: list = field(default_factory=list)
    w: list = field(default_factory=list)
    w_nom: list = field(default_factory=list)         # nominal weight (before fitting the binding gap)
    from_end: list = field(default_factory=list)
    ekind: list = field(default_factory=list)         # 'cpu', 'launch', 'stream', 'xstream', 'sync', 'coll'
    launch_of: np.ndarray | None = None               # GPU row -> CPU node (local) or -1
    exit_of: dict = field(default_factory=dict)       # CPU node -> its wait node (blocking calls)
    cpu_tid: np.ndarray | None = None
    cpu_ts: np.ndarray | None = None
    cpu_end: np.ndarray | None = None
    inferred: dict = field(default_factory=dict)      # dependency kind -> how many, and how found
    notes: list = field(default_factory=list)


def _add_node(g: RankGraph, kind: int, dur: float, start: float, release=None) -> int:
    g.kind.append(kind); g.dur.append(dur); g.start.append(start); g.release.append(release)
    return len(g.kind) - 1


def _edge(g: RankGraph, s: int, d: int, w: float, from_end: bool, kind: str, w_nom: float | None = None) -> int:
    g.src.append(s); g.dst.append(d); g.w.append(w); g.from_end.append(from_end); g.ekind.append(kind)
    g.w_nom.append(w if w_nom is None else w_nom)
    return len(g.src) - 1


def build_rank_graph(raw: RawTrace, rt: RankTrace, origin_us: float, *, tol_s: float = 20e-6,
                     queue_min_s: float = 50e-6, queue_tol_s: float = 10e-6) -> RankGraph:
    """The dependency graph of one rank (see the module docstring); times in seconds.

    ``raw`` must come from ``load_trace(..., keep_runtime=True)``; ``rt`` from
    ``build_rank(raw, origin_us)`` without rounding. ``tol_s``: how much later than every
    known constraint an op may start before a cross-stream dependency is inferred;
    ``queue_min_s`` / ``queue_tol_s``: a runtime call longer than this and 10x its name's median
    that returned within ``queue_tol_s`` after an op ended waited for the launch queue.
    """
    tl = rt.timeline
    n = len(tl)
    g = RankGraph(rank=rt.rank, rt=rt, raw=raw, n_gpu=n, n_cpu=len(raw.l_ts))
    ks, ke = tl.start_s, tl.end_s
    names = raw.names
    # ----- GPU nodes
    g.kind = [GPU] * n
    g.dur = (ke - ks).tolist()
    g.start = ks.tolist()
    g.release = [None] * n
    # ----- CPU nodes
    m = len(raw.l_ts)
    l_s = (raw.l_ts - origin_us) * 1e-6
    l_d = raw.l_dur * 1e-6 if len(raw.l_dur) == m else np.zeros(m)
    g.kind += [CPU] * m
    g.dur += l_d.tolist()
    g.start += l_s.tolist()
    g.release += [None] * m
    g.cpu_tid, g.cpu_ts, g.cpu_end = raw.l_tid.copy(), l_s, l_s + l_d
    lname = [names[i] for i in raw.l_nid] if len(raw.l_nid) == m else ["?"] * m

    # ----- launch edges (correlation id = Kineto's ac2g flow id)
    launch = np.full(n, -1, dtype=np.int64)
    if n and m:
        order = np.lexsort((raw.l_ts, raw.l_corr))
        cs = raw.l_corr[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = cs[1:] != cs[:-1]
        uc, ui = cs[first], order[first]
        pos = np.minimum(np.searchsorted(uc, raw.k_corr), len(uc) - 1)
        hit = (uc[pos] == raw.k_corr) & (raw.k_corr >= 0)
        launch[hit] = ui[pos[hit]]
    g.launch_of = launch
    dev_stream = raw.k_device * (1 << 32) + raw.k_stream if n else np.empty(0, dtype=np.int64)
    is_sync_ev = raw.k_cat == _SYNC_CAT if n else np.zeros(0, dtype=bool)

    # stream predecessor of every op (sync events are markers: not in stream order)
    prev = np.full(n, -1, dtype=np.int64)
    ops = np.flatnonzero(~is_sync_ev)
    if len(ops):
        o = ops[np.lexsort((ks[ops], dev_stream[ops]))]
        same = dev_stream[o][1:] == dev_stream[o][:-1]
        prev[o[1:][same]] = o[:-1][same]
    # nominal launch latency: median over ops whose stream was idle when launched
    has_l = launch >= 0
    ls_of = np.full(n, np.nan)             # launch start of each op (nan: no launch in the trace)
    ls_of[has_l] = l_s[launch[has_l]]
    lat_all = ks - ls_of
    idle = has_l & ((prev < 0) | (ke[np.maximum(prev, 0)] <= ls_of))
    cand = lat_all[idle & (lat_all >= 0)]
    lat0 = float(np.median(cand)) if len(cand) else 0.0
    g.notes.append(f"median launch latency {lat0 * 1e6:.1f} us")

    # cross-stream edges from cuda_sync args (wait_on_stream + record correlation)
    known_x: dict[int, list[int]] = {}
    n_args = 0
    if n and len(raw.k_wait_stream) == n and (raw.k_wait_corr >= 0).any():
        corr_ts = dict(zip(raw.l_corr.tolist(), raw.l_ts.tolist()))
        for i in np.flatnonzero(is_sync_ev & (raw.k_wait_corr >= 0) & (raw.k_wait_stream >= 0)):
            rec_ts = corr_ts.get(int(raw.k_wait_corr[i]))
            wait_launch = launch[i]
            if rec_ts is None or wait_launch < 0:
                continue
            key_src = int(raw.k_device[i]) * (1 << 32) + int(raw.k_wait_stream[i])
            key_dst = int(dev_stream[i])
            src_c = np.flatnonzero((dev_stream == key_src) & has_l & ~is_sync_ev)
            src_c = src_c[raw.l_ts[launch[src_c]] < rec_ts]
            dst_c = np.flatnonzero((dev_stream == key_dst) & has_l & ~is_sync_ev)
            dst_c = dst_c[raw.l_ts[launch[dst_c]] > raw.l_ts[wait_launch]]
            if len(src_c) and len(dst_c):
                s_op = src_c[np.argmax(raw.l_ts[launch[src_c]])]
                d_op = dst_c[np.argmin(raw.l_ts[launch[dst_c]])]
                known_x.setdefault(int(d_op), []).append(int(s_op))
                n_args += 1

    # per device: ops sorted by end, to find "ended last before t on another stream"
    by_dev: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for d in np.unique(raw.k_device[ops]) if len(ops) else []:
        rows = ops[raw.k_device[ops] == d]
        rows = rows[np.argsort(ke[rows], kind="stable")]
        by_dev[int(d)] = (rows, ke[rows])

    n_inferred = 0
    n_anchor = 0
    # the common case in numpy: candidates = stream predecessor and launch only
    has_p = prev >= 0
    t_stream = np.where(has_p, ke[np.maximum(prev, 0)], -np.inf)
    w0_all = np.where(has_l & (ks >= ls_of), np.minimum(lat0, ks - np.nan_to_num(ls_of)), 0.0)
    t_launch_c = np.where(has_l, np.nan_to_num(ls_of) + w0_all, -np.inf)
    tmax_all = np.maximum(t_stream, t_launch_c)
    is_op = np.zeros(n, dtype=bool)
    is_op[ops] = True
    special = np.zeros(n, dtype=bool)
    special[list(known_x)] = True if known_x else False
    special |= is_op & (ks - tmax_all > tol_s)          # needs a cross-stream look (or is a root)
    simple = is_op & ~special
    bind_stream = simple & has_p & (t_stream >= t_launch_c)
    rows = np.flatnonzero(simple & has_p)
    ws = np.where(bind_stream[rows], ks[rows] - t_stream[rows], -np.maximum(0.0, t_stream[rows] - ks[rows]))
    g.src += prev[rows].tolist(); g.dst += rows.tolist(); g.w += ws.tolist(); g.w_nom += [0.0] * len(rows)
    g.from_end += [True] * len(rows); g.ekind += ["stream"] * len(rows)
    rows = np.flatnonzero(simple & has_l)
    w0 = w0_all[rows]
    wl = np.where(~bind_stream[rows], w0 + ks[rows] - t_launch_c[rows], w0 - np.maximum(0.0, t_launch_c[rows] - ks[rows]))
    g.src += (n + launch[rows]).tolist(); g.dst += rows.tolist(); g.w += wl.tolist(); g.w_nom += w0.tolist()
    g.from_end += [False] * len(rows); g.ekind += ["launch"] * len(rows)
    for k in np.flatnonzero(special).tolist():
        s = ks[k]
        cands: list[tuple[float, int, float, bool, str]] = []   # (T, src, nominal w, from_end, kind)
        p = prev[k]
        if p >= 0:
            cands.append((ke[p], int(p), 0.0, True, "stream"))
        li = launch[k]
        if li >= 0:
            w0k = float(w0_all[k])
            cands.append((l_s[li] + w0k, n + int(li), w0k, False, "launch"))
        for src in known_x.get(k, ()):
            cands.append((ke[src], src, 0.0, True, "xstream"))
        tmax = max((c[0] for c in cands), default=-np.inf)
        if s - tmax > tol_s:
            rws, ends = by_dev[int(raw.k_device[k])]
            j = int(np.searchsorted(ends, s + 1e-9, side="right")) - 1
            while j >= 0 and ends[j] > tmax:
                r = int(rws[j])
                if dev_stream[r] != dev_stream[k] and ks[r] < s:
                    cands.append((ends[j], r, 0.0, True, "xstream"))
                    n_inferred += 1
                    tmax = ends[j]
                    break
                j -= 1
        if not cands:
            g.release[k] = s
            n_anchor += 1
            continue
        b = max(range(len(cands)), key=lambda i: cands[i][0])
        for i, (t, src, w, fe, ek) in enumerate(cands):
            # binding: exactly the measured start; others: never later than it (a kernel that
            # started before its launch or before its stream predecessor ended - clock jitter)
            _edge(g, src, k, w + (s - t) if i == b else w - max(0.0, t - s), fe, ek, w_nom=w)
    # sync events: placed at their measured offset after their launch (markers)
    for k in np.flatnonzero(is_sync_ev).tolist():
        li = launch[k]
        if li >= 0:
            _edge(g, n + int(li), k, ks[k] - l_s[li], False, "launch")
        else:
            g.release[k] = ks[k]

    # ----- CPU order and blocking calls
    t_launch = np.where(has_l, ls_of, np.inf)
    blocking = 0
    queue_waits = 0
    if m:
        order = np.lexsort((l_s, raw.l_tid))
        # a call far longer than usual for its name that returned just after an op ended waited
        # for a free slot of the launch queue (the GPU was behind): it returns when that op ends
        med = {}
        if len(raw.l_nid) == m:
            for nid in np.unique(raw.l_nid):
                med[int(nid)] = float(np.median(l_d[raw.l_nid == nid]))
        by_end = np.flatnonzero(~is_sync_ev)
        by_end = by_end[np.argsort(ke[by_end], kind="stable")]
        end_sorted = ke[by_end]
        own_op = {int(launch[k]): k for k in np.flatnonzero(has_l)}
        last_exit = None
        last_end = 0.0
        last_tid = None
        # plain lists: this loop visits every runtime call
        tid_l, ls_l, ld_l = raw.l_tid.tolist(), l_s.tolist(), l_d.tolist()
        nid_l = raw.l_nid.tolist() if len(raw.l_nid) == m else [0] * m
        long_l = [ld_l[j] > max(queue_min_s, 10 * med.get(nid_l[j], np.inf)) for j in range(m)] if med else [False] * m
        sync_name = {nm: any(x in nm for x in _SYNC_NAMES) for nm in set(lname)}
        src_l, dst_l, w_l, wn_l, fe_l, ek_l = g.src, g.dst, g.w, g.w_nom, g.from_end, g.ekind
        for j in order.tolist():
            tid = tid_l[j]
            node = n + j
            sj = ls_l[j]
            if tid != last_tid:
                g.release[node] = sj
            else:
                w = sj - last_end
                src_l.append(last_exit); dst_l.append(node); w_l.append(w); wn_l.append(w)
                fe_l.append(True); ek_l.append("cpu")
            last_tid = tid
            end_j = sj + ld_l[j]
            last_exit = node
            last_end = end_j
            nm = lname[j]
            is_memcpy = "Memcpy" in nm and j in own_op
            if not (is_memcpy or sync_name[nm] or long_l[j]):
                continue
            exit_node = node
            targets: list[int] = []
            own_cost = min(float(l_d[j]), 10e-6)
            if is_memcpy and l_s[j] < ke[own_op[j]] <= end_j + 1e-9:
                targets = [own_op[j]]
            elif sync_name[nm]:
                before = np.flatnonzero((t_launch < l_s[j]) & (ke <= end_j + 1e-6) & ~is_sync_ev)
                if len(before):
                    best = int(before[np.argmax(ke[before])])
                    if ke[best] > l_s[j]:
                        targets = [best]
                        if nm in _DEVICE_SYNC:   # every stream's last op launched before the call
                            bs = dev_stream[before]
                            for key in np.unique(bs):
                                rows = before[bs == key]
                                last = int(rows[np.argmax(t_launch[rows])])
                                if last != best:
                                    targets.append(last)
            elif long_l[j]:
                p = int(np.searchsorted(end_sorted, end_j + 1e-9, side="right")) - 1
                while p >= 0 and end_sorted[p] > l_s[j]:
                    op = int(by_end[p])
                    if t_launch[op] < l_s[j]:
                        if end_j - end_sorted[p] <= queue_tol_s:
                            targets = [op]
                            own_cost = min(float(l_d[j]), med.get(int(raw.l_nid[j]), 0.0))
                            queue_waits += 1
                            blocking -= 1
                        break
                    p -= 1
            if targets:
                blocking += 1
                best = targets[0]
                r = end_j - ke[best]
                d0 = own_cost
                g.dur[node] = d0
                wn = _add_node(g, WAIT, 0.0, end_j)
                _edge(g, node, wn, 0.0, True, "sync")
                for t in targets:
                    _edge(g, t, wn, r if t == best else 0.0, True, "sync")
                g.exit_of[node] = wn
                exit_node = wn
            last_exit = exit_node
            last_end = end_j
    g.inferred = {
        "launch": "correlation id (Kineto's ac2g flow id)",
        "stream_order": "device + stream id",
        "cross_stream_from_args": n_args,
        "cross_stream_inferred_from_timing": n_inferred,
        "host_sync_blocking_calls": blocking,
        "launch_queue_waits": queue_waits,
        "anchored_ops": n_anchor,
        "launch_latency_us": lat0 * 1e6,
    }
    return g
