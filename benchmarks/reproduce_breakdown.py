"""Where a Lagom reproduce setting's time goes: per step, NCCL's defaults against Lagom and
AutoCCL-style tuning, with the computation time (as run, under contention), the
communication time, the exposed communication and the bound the computation puts on any
tuning of the communication.

    python benchmarks/reproduce_breakdown.py                 # every Lagom step setting
    python benchmarks/reproduce_breakdown.py fsdp-phi2-a8    # some of them

Columns (milliseconds): ``step`` the simulated step, ``compute`` the GPU's computation time
as simulated (slowed by the communication beside it), ``comm`` the communication time,
``exposed`` the communication not hidden under computation. A last line ``no-cont`` gives
the step at NCCL's defaults with every contention term switched off: relieving contention
alone can gain at most NCCL's step over it; more needs faster communication.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import yaml

from ccoverlap.deciders.lagom.step import tune_step
from ccoverlap.predict.strategy import Planner
from ccoverlap.predict.workload import workload_from_mapping
from ccoverlap.reproduction.suite import DATA_DIR


def breakdown(workload: dict) -> dict[str, dict[str, float]]:
    """Step, compute, communication and exposed communication (seconds) of one workload
    under NCCL's defaults, Lagom and AutoCCL-style tuning."""
    w = workload_from_mapping(json.loads(json.dumps(workload)), source="breakdown")
    planner = Planner(w, jobs=1)
    rows = {"nccl": planner.evaluate(w, "nccl")}
    for method in ("lagom", "autoccl"):
        t = tune_step(planner, w, method)
        if t is not None:
            rows[method] = t.result
    return {k: {"step": r.step_time_s, "compute": r.compute_s, "comm": r.comm_s,
                "exposed": r.exposed_comm_s} for k, r in rows.items()}


#: Cost parameters that switch off every term of contention between computation and
#: communication (SMs held per channel, L2 eviction, HBM traffic both ways).
NO_CONTENTION = {"comm_sm_fraction_per_channel": 0.0, "l2_pollution_penalty": 0.0,
                 "comm_hbm_bytes_per_wire_byte": 0.0, "comm_reduce_extra_hbm_bytes": 0.0,
                 "comm_compute_interference": 0.0}


def without_contention(workload: dict) -> float:
    """The step (seconds) at NCCL's defaults with no contention at all: what tuning NC, NT
    and C can reach by relieving contention alone (a gain beyond NCCL's step over this needs
    the communication itself to run faster than NCCL's defaults)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "no-contention.json"
        path.write_text(json.dumps({"params": NO_CONTENTION}))
        w = workload_from_mapping(json.loads(json.dumps({**workload, "calibration": str(path)})),
                                  source="breakdown")
        return Planner(w, jobs=1).evaluate(w, "no-contention").step_time_s


def main(argv: list[str]) -> int:
    """Print one line per setting and method."""
    cases = yaml.safe_load((DATA_DIR / "lagom.yaml").read_text())["cases"]
    steps = [c for c in cases if c["spec"].get("kind") == "step" and (not argv or c["id"] in argv)]
    print(f"{'setting':16} {'method':8} {'step':>9} {'compute':>9} {'comm':>9} {'exposed':>9} {'speedup':>8}")
    for c in steps:
        b = breakdown(c["spec"]["workload"])
        base = b["nccl"]["step"]
        for m, r in b.items():
            print(f"{c['id']:16} {m:8} {r['step'] * 1e3:9.0f} {r['compute'] * 1e3:9.0f} {r['comm'] * 1e3:9.0f} "
                  f"{r['exposed'] * 1e3:9.0f} {base / r['step']:8.3f}")
        free = without_contention(c["spec"]["workload"])
        print(f"{c['id']:16} {'no-cont':8} {free * 1e3:9.0f} {'':>9} {'':>9} {'':>9} {base / free:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
