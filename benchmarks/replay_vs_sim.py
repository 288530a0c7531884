"""Check ``replay``'s network what-ifs against the simulator: simulate one job on a cluster
and on the same cluster with its inter-node bandwidth x2 and x0.5, replay the first job's trace
with ``--whatif network-2x,network-0.5x``, and compare the predicted step times with the ones
the simulator gives for the changed clusters. Model against model - it checks the replay's
inferred graph and edits, not the real world.

    .venv/bin/python benchmarks/replay_vs_sim.py       # Llama-3-8B, FSDP over 2x8 A40 (simulate's default)
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ccoverlap.catalog.hardware import get_cluster  # noqa: E402

JOB = ["--tp", "1", "--pp", "1", "--dp", "16", "--data-parallel", "fsdp", "--global-batch", "32",
       "--micro-batch", "1"]


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ccoverlap-replay-vs-sim-"))
    base = get_cluster("a40-pcie")
    step = {}
    for f in (1.0, 2.0, 0.5):
        d = dataclasses.asdict(base)
        d["gpu"] = base.gpu.name
        d["inter"]["bandwidth_bytes_per_s"] *= f
        d["name"] = f"a40-pcie-inter-x{f:g}"
        cl = tmp / f"cluster-{f:g}.json"
        cl.write_text(json.dumps(d))
        out = tmp / f"sim-{f:g}"
        subprocess.run([sys.executable, "-m", "ccoverlap", "simulate", "--cluster", str(cl), *JOB, "--out", str(out),
                        "--json"], check=True, capture_output=True, text=True, cwd=ROOT)
        a = subprocess.run([sys.executable, "-m", "ccoverlap", "analyze", str(out), "--json", "--no-png"],
                           check=True, capture_output=True, text=True, cwd=ROOT)
        step[f] = json.loads(a.stdout)["ranks"][0]["step_time_s"]
    preds = {}
    for label, extra in (("1/F", []), ("cost model", ["--cluster", "a40-pcie"])):
        r = subprocess.run([sys.executable, "-m", "ccoverlap", "replay", str(tmp / "sim-1"), *extra,
                            "--whatif", "network-2x,network-0.5x", "--json", "-q"],
                           check=True, capture_output=True, text=True, cwd=ROOT)
        doc = json.loads(r.stdout)
        pred = {1.0: doc["replay"]["step_time_s"]}
        for w in doc["whatifs"]:
            pred[float(w["name"].split("-")[1][:-1])] = w["step_time_s"]
        preds[label] = pred
    print("| inter-node bandwidth | simulated step s | replay, 1/F s | difference | replay, --cluster a40-pcie s | "
          "difference |")
    print("|---|---|---|---|---|---|")
    for f in (1.0, 2.0, 0.5):
        a, b = preds["1/F"][f], preds["cost model"][f]
        print(f"| x{f:g} | {step[f]:.3f} | {a:.3f} | {100 * (a - step[f]) / step[f]:+.1f}% | {b:.3f} | "
              f"{100 * (b - step[f]) / step[f]:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
