"""``--engine ray`` on a local Ray cluster (2 CPUs, started once for this module): the per-rank
work on Ray's workers gives the local analysis and the local layout search, from paths and
``file://`` URLs, through the Python API, the command line and ``--address`` from another
process; a failing task or an unreachable address is one line. Skipped without the Ray extra."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys

import pytest
from conftest import FIXTURES

from ccoverlap.cli import main
from ccoverlap.errors import CCOverlapError
from ccoverlap.trace.analyze import analyze
from ccoverlap.workers.pool import SerialEngine

ray = pytest.importorskip("ray")

JOBS = [FIXTURES / "gloo_2rank", FIXTURES / "gloo_tpdp_4rank", FIXTURES / "synthetic" / "two_steps"]


@pytest.fixture(scope="module")
def engine():
    """A RayEngine on a 2-CPU local cluster started once for the module."""
    from ccoverlap.workers.ray_cluster import RayEngine

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    yield RayEngine()
    if started:
        ray.shutdown()


def test_ray_analysis_equals_the_local_one(engine, shared_traces):
    assert engine.jobs == 2
    jobs = JOBS + [d for d in (shared_traces / "trace_filter", shared_traces / "nccl_parser_config") if d.is_dir()]
    for job in jobs:   # the 4-rank gloo job also runs ranks again with the job's thread groups
        assert analyze([job], engine=engine).to_dict() == analyze([job], engine=SerialEngine()).to_dict(), job


def test_cli_engine_ray_on_file_urls_prints_the_local_json(engine, capsys):
    job = FIXTURES / "gloo_tpdp_4rank"
    assert main(["analyze", str(job), "--json", "-q"]) == 0
    local = capsys.readouterr().out
    assert main(["analyze", f"file://{job}", "--engine", "ray", "--json", "-q"]) == 0
    remote = capsys.readouterr().out
    assert remote.replace(f"file://{job}/", f"{job}/") == local
    assert main(["analyze", str(job), "--engine", "ray"]) == 0   # the tables too
    assert "Per rank" in capsys.readouterr().out


def test_address_of_a_running_cluster_from_another_process(engine):
    job = FIXTURES / "gloo_2rank"
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "ccoverlap", "analyze", str(job), "--json", "-q"]
    local = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    remote = subprocess.run(cmd + ["--engine", "ray", "--address", address], capture_output=True, text=True,
                            timeout=300)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)


def test_unreachable_address_is_one_line():
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "ccoverlap", "analyze", str(JOBS[0]), "--engine", "ray",
                          "--address", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith(f"ccoverlap analyze: error: --address 127.0.0.1:{port}: no Ray cluster reachable")
    assert out.stderr.count("\n") == 1


def test_a_failing_task_is_one_line(engine):
    with pytest.raises(CCOverlapError, match="a Ray task failed") as err:
        list(engine.map(json.loads, ["1", "not a number"]))
    assert "\n" not in str(err.value)
    assert list(engine.map(json.loads, [str(i) for i in range(9)])) == list(range(9))   # order kept past the window


def test_plan_search_on_ray_equals_the_local_search(engine):
    from ccoverlap.planning.search import search
    from ccoverlap.predict.workload import workload_from_mapping

    w = workload_from_mapping({"model": "phi-2", "cluster": "dgx-h100", "nodes": 1, "parallel": {"dp": 8},
                               "batch": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048}})
    local = search(w, max_simulations=5, top=2).to_dict()
    remote = search(w, max_simulations=5, top=2, engine=engine).to_dict()
    local.pop("seconds"), remote.pop("seconds")
    assert remote == local
    assert remote["simulated"] == 5 and remote["ranked"][0]["best_knobs_step_time_s"] is not None
