"""Lagom's cluster-B comparisons against one NCCL channel's rate over PCIe.

NCCL's default on an 8-GPU PCIe 4.0 node is 2 channels (docs/seeds.md), so what NCCL's
defaults leave of the PCIe bandwidth, and hence what Lagom and AutoCCL-style tuning can win,
depends on how fast one channel moves data over PCIe. No public measurement gives that rate
for an Ampere GPU over PCIe 4.0; this script shows how the comparisons move with it, each
value set for the A40 through a calibration file (one value for every setting).

    python benchmarks/lagom_channel_rate.py             # 20, 16, 14, 11 GB/s
    python benchmarks/lagom_channel_rate.py 20 11       # the rates to try, GB/s

Prints, per rate, Lagom / NCCL and AutoCCL / NCCL for each cluster-B setting of
``ccoverlap/data/reproduce/lagom.yaml`` and cluster A's one-node FSDP settings (whose
8-channel default is not bound by the channel rate), and the range ends the counted cases
compare.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from ccoverlap.reproduction.lagom import step_times
from ccoverlap.reproduction.suite import DATA_DIR


def ratios(cases: list[dict], gbps: float) -> dict[str, tuple[float, float]]:
    """``{case id: (NCCL / Lagom, NCCL / AutoCCL)}`` with one channel at ``gbps`` GB/s."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "channel.json"
        path.write_text(json.dumps({"params": {"channel_bytes_per_s": gbps * 1e9}}))
        for c in cases:
            wl = {**c["spec"]["workload"], "calibration": str(path)}
            t = step_times(json.dumps(wl, sort_keys=True))
            out[c["id"]] = (t["nccl"] / t["lagom"], t["nccl"] / t["autoccl"])
    return out


def main(argv: list[str]) -> int:
    """Print the table."""
    rates = [float(a) for a in argv] or [20.0, 16.0, 14.0, 11.0]
    cases = [c for c in yaml.safe_load((DATA_DIR / "lagom.yaml").read_text())["cases"]
             if c["spec"].get("kind") == "step" and c["id"].endswith(("-b", "-b8", "-a8"))]
    for gbps in rates:
        r = ratios(cases, gbps)
        for cid, (lg, ac) in r.items():
            print(f"{gbps:5.1f} GB/s  {cid:16} lagom {lg:6.3f}  autoccl {ac:6.3f}")
        for prefix in ("fsdp-", "tp-", "ep-"):
            lg = [v[0] for k, v in r.items() if k.startswith(prefix)]
            ac = [v[1] for k, v in r.items() if k.startswith(prefix)]
            print(f"{gbps:5.1f} GB/s  {prefix + '*':16} lagom {min(lg):.3f}-{max(lg):.3f}  "
                  f"autoccl {min(ac):.3f}-{max(ac):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
