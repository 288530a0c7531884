"""The two simulator speed-check tools: ``sim_identity.fingerprint`` tells two steps apart by
any op field or any time, and ``sim_instructions`` refuses bad input with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

from bench_scripts import BENCH, load_script

from ccoverlap.sim.graph import OpGraph
from ccoverlap.sim.simulator import simulate
from ccoverlap.specs import GemmSpec


class _Cost:
    def duration_s(self, spec, concurrent):
        return spec.flops / 1e12 * (1 + len(concurrent))


def _graph(k=512, dep=True):
    g = OpGraph()
    a = g.add("a", GemmSpec(m=128, n=128, k=k))
    g.add("b", GemmSpec(m=128, n=128, k=256), stream="other", deps=[a] if dep else [])
    return g


def test_fingerprint_sees_an_op_field_and_a_time():
    fp = load_script("sim_identity").fingerprint
    g = _graph()
    base = fp(g.ops, simulate(g, _Cost()))
    assert base == fp(_graph().ops, simulate(_graph(), _Cost()))
    g2 = _graph(dep=False)  # same ops but one dependency less: records and times differ
    other = fp(g2.ops, simulate(g2, _Cost()))
    assert other[0] != base[0] and other[1] != base[1]
    tl = simulate(g, _Cost())
    tl.end_s[-1] = float(tl.end_s[-1]) * (1 + 1e-15) + 1e-300  # one ulp-level change of one time
    assert fp(g.ops, tl)[1] != base[1] and fp(g.ops, tl)[0] == base[0]


def test_sim_instructions_rejects_a_missing_baseline_and_missing_valgrind(tmp_path):
    script = os.path.join(BENCH, "sim_instructions.py")
    env = dict(os.environ, PATH=str(tmp_path))  # no valgrind on this PATH
    out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True)
    assert out.returncode == 2 and "valgrind is not on the PATH" in out.stderr and "Traceback" not in out.stderr
    fake = tmp_path / "valgrind"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    out = subprocess.run([sys.executable, script, "--baseline", str(tmp_path / "nowhere")], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "no ccoverlap package there" in out.stderr and "Traceback" not in out.stderr
