"""`ccoverlap plan` / `simulate`: the built-in example, JSON output, and one-line errors on bad input."""

import json
import subprocess
import sys

import pytest

from ccoverlap.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,needle", [
    (["--model", "llama-9"], "unknown model 'llama-9'"),
    (["--cluster", "B300"], "unknown cluster 'B300'"),
    (["--model", "llama-3-8b", "--cluster", "dgx-h100", "--nodes", "1", "--tp", "3", "--dp", "1", "--pp", "1"],
     "tp"),
    (["--cluster", "dgx-h100", "--nodes", "2", "--tp", "2", "--dp", "4"], "16"),
    (["--seq-len", "-5"], "seq_len"),
    (["--micro-batch", "0"], "micro_batch"),
    (["--knob", "fsdp_prefetch=-1"], "fsdp_prefetch"),
    (["--knob", "colour=red"], "colour"),
    (["--nodes", "0"], "nodes"),
    (["--strategies", "lagom,nope"], "unknown strategy 'nope'; available: lagom, autoccl, knobs+lagom, centauri, ficco"),
])
def test_bad_workloads_fail_with_one_line_and_exit_2(capsys, argv, needle, tmp_path):
    code, out, err = _run(capsys, "plan", "--no-png", "--out", str(tmp_path), *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle.lower() in lines[0].lower()
    assert "Traceback" not in err


@pytest.mark.parametrize("text,suffix,needle", [
    ("model: [unclosed", ".yaml", "not valid YAML"),
    ('{"model": "llama-3-8b",', ".json", "not valid JSON"),
    ("parallel = 3", ".toml", "parallel"),
    ("planets: 3", ".yaml", "unknown top-level key"),
])
def test_malformed_config_files(capsys, tmp_path, text, suffix, needle):
    cfg = tmp_path / f"cfg{suffix}"
    cfg.write_text(text)
    code, _, err = _run(capsys, "plan", "--no-png", "--out", str(tmp_path), "--config", str(cfg))
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert needle in err and str(cfg) in err


def test_plan_json_has_as_given_first_and_required_fields(capsys, tmp_path):
    code, out, _ = _run(capsys, "plan", "--json", "--png", "--out", str(tmp_path), "--model", "phi-2",
                        "--cluster", "dgx-h100", "--nodes", "1", "--dp", "8", "--data-parallel", "ddp",
                        "--global-batch", "16", "--micro-batch", "1", "--seq-len", "2048")
    assert code == 0
    doc = json.loads(out)
    names = [s["name"] for s in doc["strategies"]]
    assert names[:3] == ["as-given", "no-overlap", "best-knobs"]
    for s in doc["strategies"]:
        for key in ("name", "knobs", "step_time_s", "tokens_per_s", "mfu", "exposed_comm_s", "overlap_ratio",
                    "peak_memory_bytes"):
            assert key in s
        assert s["step_time_s"] > 0 and 0 < s["mfu"] < 1
    given, no_overlap = doc["strategies"][0], doc["strategies"][1]
    # DDP overlaps the gradient all-reduce with backward: turning overlap off cannot be faster
    assert no_overlap["step_time_s"] >= given["step_time_s"]
    assert no_overlap["overlap_ratio"] == 0.0
    assert (tmp_path / "plan.png").stat().st_size > 10_000
    assert (tmp_path / "as-given" / "rank-0.json").exists()


def test_simulate_writes_traces_that_the_metrics_agree_with(capsys, tmp_path):
    code, out, _ = _run(capsys, "simulate", "--json", "--out", str(tmp_path / "sim"), "--model", "llama-3-8b",
                        "--cluster", "dgx-h100", "--nodes", "1", "--tp", "2", "--pp", "2", "--dp", "2",
                        "--pp-schedule", "1f1b", "--global-batch", "8", "--micro-batch", "1", "--seq-len", "1024")
    assert code == 0
    doc = json.loads(out)
    assert len(doc["ranks"]) == 2  # one simulated rank per pipeline stage
    trace = json.loads((tmp_path / "sim" / "rank-1.json").read_text())
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    end_us = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    assert end_us == pytest.approx(doc["ranks"][1]["step_time_s"] * 1e6, rel=1e-6)


def test_no_traceback_from_the_console_entry_point():
    proc = subprocess.run([sys.executable, "-m", "ccoverlap", "plan", "--model", "gpt-5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown model" in proc.stderr


def test_config_file_knobs_may_nest_a_comm_config(capsys, tmp_path):
    """The knobs section is parsed like OverlapKnobs.from_dict: comm_config as a mapping."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("knobs:\n  comm_config: {channels: 4, chunk_bytes: 524288}\ncluster: a40-pcie\nnodes: 2\n"
                   "parallel: {dp: 16, data_parallel: fsdp}\nbatch: {global_batch: 32, micro_batch: 1, seq_len: 2048}\n")
    code, out, err = _run(capsys, "simulate", "--json", "--out", str(tmp_path / "sim"), "--config", str(cfg))
    assert code == 0, err
    from ccoverlap.config import read_config_file
    from ccoverlap.predict.workload import workload_from_mapping

    w = workload_from_mapping(read_config_file(cfg))
    assert w.knobs.comm_config.channels == 4 and w.knobs.comm_config.chunk_bytes == 524288


def test_built_in_example_is_compute_bound_and_overlap_choices_matter(capsys, tmp_path):
    code, out, _ = _run(capsys, "plan", "--json", "--no-png", "--out", str(tmp_path), "--strategies", "lagom")
    assert code == 0
    doc = json.loads(out)
    assert doc["source"] == "built-in example"
    assert doc["compute_comm_ratio"] > 1  # compute could hide the communication
    t = {s["name"]: s["step_time_s"] for s in doc["strategies"]}
    # the decision matters: no overlap is more than 5% slower, the best strategy more than 3% faster
    assert t["no-overlap"] > 1.05 * t["as-given"]
    assert min(t.values()) < 0.97 * t["as-given"]


def test_the_progress_bar_runs_no_thread_the_planner_could_fork():
    # the planner forks worker processes; a rich refresh thread alive at fork time may deadlock
    # the child (Python 3.12 warns). The bar must be drawn from the caller's updates instead.
    import io
    import threading
    import time

    from ccoverlap.console import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    before = threading.active_count()
    stream = Tty()
    progress = Progress("planning", stream=stream)
    time.sleep(1.05)                     # the bar appears only after a second
    progress(1, 10, "candidate 1")
    progress(10, 10, "candidate 10")
    try:
        assert progress._bar is not None and "candidate" in stream.getvalue()  # a bar was drawn
        assert threading.active_count() == before
    finally:
        progress.close()


@pytest.mark.slow
@pytest.mark.parametrize("config", [None, "examples/phi2-fsdp-a40-nvlink.yaml", "examples/centauri-zero3-cluster-a.yaml",
                                    "examples/llama3-8b-fsdp-a40.yaml"])
def test_plan_best_is_the_fastest_step_a_user_can_apply(capsys, tmp_path, config):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    argv = ["plan", "--json", "--no-png", "--out", str(tmp_path)] + (["--config", str(root / config)] if config else [])
    code, out, _ = _run(capsys, *argv)
    assert code == 0
    doc = json.loads(out)
    rows = {s["name"]: s for s in doc["strategies"]}
    app = rows["applicable"]
    # what a user gets from each row: its applicable step where that was checked, else its own
    fitting = [s for s in doc["strategies"] if s["name"] != "applicable" and s["fits_memory"]]
    gets = {s["name"]: s.get("applicable_step_time_s", s["step_time_s"]) for s in fitting}
    assert doc["best_step_time_s"] == pytest.approx(min(gets.values()), rel=1e-12)
    assert doc["best"] == min(gets, key=gets.__getitem__)
    assert app["decision"]["of"] == doc["best"]
    assert doc["best_step_time_s"] == pytest.approx(rows[doc["best_row"]]["step_time_s"], rel=1e-12)
    # the recommended strategy's settable part is never slower than what is recommended
    assert app["step_time_s"] >= doc["best_step_time_s"] * (1 - 1e-12)
    # one short line, the details under it
    assert "\n" not in doc["recommendation"] and len(doc["recommendation"]) <= 80
    assert all("\n" not in line for line in doc["recommendation_details"])
