"""benchmarks/gpu_session.sh on CPU: usage errors, the budgeted steps and the packing into at
most 8 files, and the background calibration that outlasts one call (with a stand-in python
whose `ccoverlap calibrate` only sleeps and writes a file)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None
                                or shutil.which("setsid") is None, reason="needs bash, timeout and setsid")


def _run(*args, env=None, cwd=ROOT, timeout=240):
    e = {k: v for k, v in os.environ.items() if k not in ("OUT", "CCOV_WORK")}
    e.update(env or {})
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=timeout)


def test_plan_and_usage_errors(tmp_path):
    plan = _run("--plan")
    assert plan.returncode == 0 and all(p in plan.stdout for p in ("part1", "part2", "part3"))
    bad = _run("part9", env={"OUT": str(tmp_path)})
    assert bad.returncode == 2 and "unknown part 'part9'" in bad.stderr
    no_out = _run("part2")
    assert no_out.returncode == 2 and "set OUT" in no_out.stderr
    elsewhere = _run("part2", env={"OUT": str(tmp_path)}, cwd=tmp_path)
    assert elsewhere.returncode == 2 and "repository root" in elsewhere.stderr


@pytest.mark.slow
def test_part2_on_cpu_packs_everything_into_at_most_8_files(tmp_path):
    pytest.importorskip("torch")
    out, work = tmp_path / "out", tmp_path / "work"
    r = _run("part2", env={"OUT": str(out), "CCOV_WORK": str(work), "PYTHON": sys.executable,
                           "CCOV_PYTEST_TARGET": "tests/benchmarks/test_gpu_gemm_vs_model.py",
                           "CCOV_BENCH_SIZE": "128"})
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and "part2.tar.gz" in files and "part2-summary.md" in files, files
    assert "pytest-gpu.log" in files
    with tarfile.open(out / "part2.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"./env.txt", "./steps.tsv", "./logs/pytest-gpu.log", "./logs/bench-cuda.log"} <= names
    assert any(n.startswith("./bench-trace/") and n.endswith(".json") for n in names)
    summary = (out / "part2-summary.md").read_text()
    assert "| pytest-gpu | 0 |" in summary and "| bench-cuda | 0 |" in summary
    assert "run  pytest-gpu (timeout" in r.stdout   # progress lines carry times


FAKE_PY = """#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "ccoverlap" ] && [ "$3" = "calibrate" ]; then
  out=""; prev=""
  for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
  echo "stand-in calibrate"; sleep 6
  echo '{"gpu": "H100-SXM", "params": {}}' > "$out"; echo "held-out median 3%"; exit 0
fi
exec "REAL_PYTHON" "$@"
"""


def test_calibration_outlasting_a_call_is_collected_by_the_next(tmp_path):
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY.replace("REAL_PYTHON", sys.executable))
    fake.chmod(0o755)
    out, work = tmp_path / "out", tmp_path / "work"
    env = {"OUT": str(out), "CCOV_WORK": str(work), "PYTHON": str(fake), "CCOV_POLL_S": "1"}
    first = _run("part1", env={**env, "CCOV_BUDGET_S": "27"})   # about 2 s of waiting: not enough
    assert first.returncode == 0, first.stderr
    assert "STILL RUNNING" in first.stdout
    assert "still-running" in (out / "part1-summary.md").read_text()
    assert not list(out.glob("h100*.json"))
    shutil.rmtree(out)
    second = _run("part1", env={**env, "CCOV_BUDGET_S": "60"})
    assert "already running" in second.stdout or "finished in an earlier call" in second.stdout, second.stdout
    assert "calibrate finished (exit 0)" in second.stdout
    assert (out / "h100-sxm.json").is_file()
    assert "| calibrate | 0 |" in (out / "part1-summary.md").read_text()


FAKE_SESSION_PY = """#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "ccoverlap" ] && [ "$3" = "calibrate" ]; then
  out=""; prev=""
  for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
  echo "measuring"; sleep MEASURE_S
  echo '{"gpu": "H100-SXM", "params": {}}' > "$out"; echo "fitting 12 measurements ..."; sleep 3
  echo "held-out median 3%"; exit 0
fi
exec "REAL_PYTHON" "$@"
"""


def _fake_session_python(tmp_path, measure_s):
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_SESSION_PY.replace("REAL_PYTHON", sys.executable).replace("MEASURE_S", str(measure_s)))
    fake.chmod(0o755)
    return fake


def test_short_run_waits_for_the_measurements_runs_the_rest_beside_the_fit_and_collects_it(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {"OUT": str(out), "CCOV_WORK": str(work), "PYTHON": str(_fake_session_python(tmp_path, 3)),
           "CCOV_POLL_S": "1", "CCOV_BUDGET_S": "120",
           "CCOV_PYTEST_TARGET": "tests/benchmarks/test_gpu_gemm_vs_model.py::test_measuring_without_cuda_says_so"}
    r = _run("short", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    log = r.stdout
    assert log.index("calibrate: fitting") < log.index("run  layer-trace")  # GPU steps only after the measuring
    for step in ("layer-trace", "pytest-gpu", "gemm-vs-model", "ficco-pieces"):
        assert f"run  {step} (timeout" in log, step
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"short.tar.gz", "short-summary.md", "calibration.json"} <= set(files), files
    summary = (out / "short-summary.md").read_text()
    assert "| calibrate | 0 |" in summary and "| layer-trace | 2 |" in summary  # no CUDA here: exit 2, said so


def test_short_run_stops_a_calibration_that_measures_too_long(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {"OUT": str(out), "CCOV_WORK": str(work), "PYTHON": str(_fake_session_python(tmp_path, 60)),
           "CCOV_POLL_S": "1", "CCOV_BUDGET_S": "60", "CCOV_CAL_MEASURE_S": "3",
           "CCOV_PYTEST_TARGET": "tests/benchmarks/test_gpu_gemm_vs_model.py::test_measuring_without_cuda_says_so"}
    r = _run("short", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "still measuring after 3 s: stopped" in r.stdout
    summary = (out / "short-summary.md").read_text()
    assert "| calibrate | stopped |" in summary
