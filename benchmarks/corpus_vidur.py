"""Write the collective corpus tables read from microsoft/vidur's network profiling CSVs.

Usage::

    python benchmarks/corpus_vidur.py VIDUR_GIT_DIR [--out ccoverlap/data/corpus/collective]

``VIDUR_GIT_DIR`` is a clone (or bare git directory) of https://github.com/microsoft/vidur;
the files are read with ``git show COMMIT:PATH`` at the commits named in :data:`TABLES`, so
the output does not depend on what is checked out. Only the numbers carry over: for each
(collective, GPUs, nodes) the rows whose size is nearest to 2^(k/2) bytes are kept (two a
octave: vidur sweeps ~1000 sizes at an even step), the time is vidur's median
(``time_stats.<op>.median``, milliseconds -> seconds) and ``size`` is already bytes
(``collectives_wrapper.py``: ``"size": self._size * 2  # bytes`` of an fp16 buffer; the
older A40 file gives ``n_embd x num_tokens`` fp16 elements, times 2 here).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import subprocess
from collections import defaultdict
from pathlib import Path

HEAD = "7d47513"  # microsoft/vidur main, 2024
A40_COMMIT = "0633efa"  # microsoft/vidur: the A40 all-reduce table of January 2024 (the table's notes)

#: name -> (commit, path, collective, cluster, gpu, keep multi-node rows)
TABLES = {
    "vidur_a100_dgx_all_reduce": (HEAD, "data/profiling/network/a100_dgx/all_reduce.csv", "all_reduce",
                                  "dgx-a100", "A100-80GB-SXM", False),
    "vidur_a100_dgx_send_recv": (HEAD, "data/profiling/network/a100_dgx/send_recv.csv", "send_recv",
                                 "dgx-a100", "A100-80GB-SXM", False),
    "vidur_h100_dgx_all_reduce": (HEAD, "data/profiling/network/h100_dgx/all_reduce.csv", "all_reduce",
                                  "dgx-h100", "H100-SXM", True),
    "vidur_h100_dgx_send_recv": (HEAD, "data/profiling/network/h100_dgx/send_recv.csv", "send_recv",
                                 "dgx-h100", "H100-SXM", True),
    "vidur_a100_pairwise_nvlink_all_reduce": (HEAD, "data/profiling/network/a100_pairwise_nvlink/all_reduce.csv",
                                              "all_reduce", "a100-pcie-nvlink-pairs", "A100-80GB-SXM", False),
    "vidur_a100_pairwise_nvlink_send_recv": (HEAD, "data/profiling/network/a100_pairwise_nvlink/send_recv.csv",
                                             "send_recv", "a100-pcie-nvlink-pairs", "A100-80GB-SXM", False),
    "vidur_h100_pairwise_nvlink_all_reduce": (HEAD, "data/profiling/network/h100_pairwise_nvlink/all_reduce.csv",
                                              "all_reduce", "h100-nvl-nvlink-pairs", "H100-SXM", False),
    "vidur_a40_all_reduce": (A40_COMMIT, "data/profiling/a40/all_reduce.csv", "all_reduce", "a40-nvlink", "A40", False),
}
COLUMNS = ("cluster", "collective", "gpus", "nodes", "nbytes", "time_s", "busbw_gbs")


def _git_show(repo: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def _busbw(collective: str, nbytes: float, n: int, t: float) -> float:
    factor = 2.0 * (n - 1) / n if collective == "all_reduce" else 1.0
    return nbytes / t * factor / 1e9


def _rows(text: str, collective: str, cluster: str, keep_multi: bool) -> list[dict]:
    groups: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO(text)):
        n = int(r["num_workers"])
        if "size" in r:
            nbytes, per_node = int(r["size"]), int(r["devices_per_node"])
        else:  # January 2024 format: an (num_tokens, n_embd) fp16 buffer on one node
            nbytes, per_node = int(r["n_embd"]) * int(r["num_tokens"]) * 2, n
        nodes = n // per_node if n >= per_node else 1
        t = float(r[f"time_stats.{collective}.median"]) * 1e-3
        if nbytes <= 0 or t <= 0 or (nodes > 1 and not keep_multi):
            continue
        groups[(n, nodes)].append((nbytes, t))
    out = []
    for (n, nodes), pts in sorted(groups.items()):
        sizes = sorted({b for b, _ in pts})
        lo, hi = math.ceil(2 * math.log2(sizes[0])), math.floor(2 * math.log2(sizes[-1]))
        chosen = sorted({min(sizes, key=lambda b, k=k: abs(math.log2(b) - k / 2)) for k in range(lo, hi + 1)})
        by_size: dict[int, list[float]] = defaultdict(list)
        for b, t in pts:
            by_size[b].append(t)
        for b in chosen:
            t = sorted(by_size[b])[len(by_size[b]) // 2]
            out.append({"cluster": cluster, "collective": collective, "gpus": n, "nodes": nodes, "nbytes": b,
                        "time_s": f"{t:.6g}", "busbw_gbs": f"{_busbw(collective, b, n, t):.4g}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path)
    ap.add_argument("--out", type=Path, default=Path("ccoverlap/data/corpus/collective"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (commit, path, coll, cluster, _gpu, multi) in TABLES.items():
        rows = _rows(_git_show(args.repo, commit, path), coll, cluster, multi)
        with open(args.out / f"{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        print(f"{name}: {len(rows)} rows")


if __name__ == "__main__":
    main()
