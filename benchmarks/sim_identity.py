"""Fingerprints of built steps and simulated times, to show a speed change keeps them bit for bit.

For each workload of ``tests/sim/regression`` and each ``bench_simulate.py`` target, prints the
SHA-1 of the built op records (every field of every op, in order) and of the simulated start
and end times (their float64 bytes), as JSON. Run it on two trees and compare the outputs:

    PYTHONPATH=. python benchmarks/sim_identity.py > this.json
    PYTHONPATH=../base python benchmarks/sim_identity.py > base.json   # another checkout
    cmp this.json base.json && echo identical

The tree whose ``ccoverlap`` was imported is printed on stderr (``PYTHONPATH`` decides it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fingerprint(ops, timeline) -> list[str]:
    """[SHA-1 of the op records (every field, in order), SHA-1 of the start and end times'
    float64 bytes] of one built and simulated step."""
    return [hashlib.sha1(repr([tuple(op) for op in ops]).encode()).hexdigest(),
            hashlib.sha1(timeline.start_s.tobytes() + timeline.end_s.tobytes()).hexdigest()]


def fingerprints() -> dict:
    """{workload name: [op records SHA-1, start/end times SHA-1]}."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "sim_regression"))
    from bench_simulate import TARGETS
    from regression_workloads import WORKLOADS

    from ccoverlap.predict.evaluate import build_workload_step, cost_model_for
    from ccoverlap.predict.workload import workload_from_mapping
    from ccoverlap.sim.simulator import simulate

    mappings = dict(WORKLOADS)
    mappings.update({name: t["workload"] for name, t in TARGETS.items()})
    out = {}
    for name, m in mappings.items():
        w = workload_from_mapping(m, source=name)
        step = build_workload_step(w)
        tl = simulate(step.graph, cost_model_for(w))
        out[name] = fingerprint(step.graph.ops, tl)
    return out


def main() -> int:
    """Print the fingerprints as JSON (and the imported package's path on stderr)."""
    out = fingerprints()
    import ccoverlap

    print(f"ccoverlap from {os.path.dirname(ccoverlap.__file__)}", file=sys.stderr)
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
