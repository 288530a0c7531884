"""Hostile configuration and runs files: each ends with one line on stderr (exit 2, or exit 0
when a runs file still has good runs), no traceback, inside 10 s and 1 GiB of address space.

Every case runs ``python -m ccoverlap`` in its own process under ``RLIMIT_AS`` (1 GiB) and a
10 s timeout, so a config that tried to build a huge step would die of MemoryError (a
traceback) or time out, and fail here. A hypothesis test then throws random values at every
field of a workload mapping in-process: each is a Workload or one short ConfigError; the same
values given to the configurations built directly in Python get the same answer, and the memory
estimate called directly with any layout is an estimate or one ConfigError.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccoverlap.config import dataclass_from_mapping, field_names
from ccoverlap.errors import ConfigError
from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig
from ccoverlap.predict.workload import workload_from_mapping

LIMIT_BYTES = 1 << 30
TIMEOUT_S = 10


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``ccoverlap ARGS`` in a fresh process under 1 GiB of address space and 10 s."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ccoverlap", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, preexec_fn=_limit, env=env)


def laughs(levels: int = 9) -> str:
    """A YAML flow list whose anchors nest ``levels`` times (9**levels leaves when expanded,
    about 1 KB of text): the "billion laughs" in one field's value."""
    parts = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    parts += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "[" + ", ".join(parts) + "]"


def one_line_error(p: subprocess.CompletedProcess, words: str | None = None) -> str:
    err = p.stderr.strip()
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert len(err.splitlines()) == 1, p.stderr[-2000:]
    assert len(err) < 1000, err[:300]
    if words is not None:
        assert words in err, err
    return err


BIG = "x" * (10 * 2**20)  # 10 MiB: under the file-size cap, so the value itself reaches the checks

# (name, file name, text, words the one line must contain)
CONFIGS = [
    ("global_batch 1e15", "c.yaml", "batch: {global_batch: 1.0e+15}\n", "global_batch must be an integer"),
    ("global_batch 10**15", "c.yaml", "batch: {global_batch: 1000000000000000}\n", "global_batch must be an integer <="),
    ("global_batch 10**400", "c.yaml", "batch: {global_batch: 1" + "0" * 400 + "}\n", "global_batch must be an integer <="),
    ("huge step", "c.yaml", "batch: {global_batch: 4000000, micro_batch: 1}\nparallel: {dp: 8}\n",
     "the step would have about"),
    ("layers 1e6", "c.json", json.dumps({"model": {"hidden": 64, "ffn_hidden": 256, "heads": 4, "layers": 1e6,
                                                   "vocab": 100, "seq_len": 64}}), "layers must be an integer"),
    ("layers 10**6", "c.json", json.dumps({"model": {"hidden": 64, "ffn_hidden": 256, "heads": 4, "layers": 10**6,
                                                     "vocab": 100, "seq_len": 64}, "parallel": {"dp": 8},
                                           "batch": {"global_batch": 8, "seq_len": 64}}), "the step would have about"),
    ("layers 10**400", "c.yaml", "model: {hidden: 64, ffn_hidden: 256, heads: 4, vocab: 100, seq_len: 64, layers: 1"
     + "0" * 400 + "}\n", "more than 2147483647"),
    ("TOML nodes = 'two'", "c.toml", 'nodes = "two"\n', "nodes must be an integer, got 'two'"),
    ("TOML nodes = true", "c.toml", "nodes = true\n", "nodes must be an integer, got True"),
    ("TOML nodes = 2.5", "c.toml", "nodes = 2.5\n", "nodes must be an integer, got 2.5"),
    ("nodes 2*10**6", "c.yaml", "nodes: 2000000\n", "nodes must be an integer <="),
    ("tp = true", "c.toml", "[parallel]\ntp = true\n", "tp must be an integer, got True"),
    ("tp -1", "c.yaml", "parallel: {tp: -1}\n", "tp must be an integer >= 1"),
    ("tp 2**63", "c.yaml", f"parallel: {{tp: {2**63}}}\n", "tp must be an integer <="),
    ("bucket nan", "c.yaml", "knobs: {bucket_cap_mb: .nan}\nbatch: {global_batch: 8}\n", "bucket_cap_mb must be a number"),
    ("bucket inf", "c.yaml", "knobs: {bucket_cap_mb: .inf}\nbatch: {global_batch: 8}\n", "bucket_cap_mb must be a number <="),
    ("billion laughs in tp", "c.yaml", f"parallel: {{tp: {laughs()}}}\n", "tp must be an integer"),
    ("billion laughs as model", "c.yaml", f"model: {laughs()}\n", "model"),
    ("billion laughs in a knob", "c.yaml", f"knobs: {{comm_config: {{channels: {laughs()}}}}}\n"
     "batch: {global_batch: 8}\n",
     "channels must be an integer"),
    ("billion laughs as a section", "c.yaml", f"batch: {laughs()}\n", "'batch' must be a mapping"),
    ("10 MiB string in a choice", "c.json", json.dumps({"parallel": {"data_parallel": BIG}}),
     "data_parallel must be one of ['ddp', 'fsdp'], got 'xxx"),
    ("10 MiB key", "c.json", json.dumps({BIG: 1}), "unknown top-level key 'xxx"),
    ("10 MiB model name", "c.json", json.dumps({"model": BIG}), "unknown model 'xxx"),
    ("10 MiB cluster name", "c.json", json.dumps({"cluster": BIG}), "unknown cluster 'xxx"),
    ("10 MiB framework name", "c.json", json.dumps({"framework": BIG, "batch": {"global_batch": 8}}),
     "unknown profile 'xxx"),
    ("10 KiB model file name", "c.json", json.dumps({"model": "m" * 10000 + ".yaml"}), "cannot read the file"),
    ("10 KiB calibration file name", "c.json", json.dumps({"calibration": "c" * 10000 + ".json",
                                                           "batch": {"global_batch": 8}}), "cannot read"),
    ("knob key with a newline", "c.yaml", "batch: {global_batch: 8}\nknobs: {comm_config_overrides: {'a\\nb': 1}}\n",
     "comm_config_overrides"),
    ("deep nesting", "c.json", '{"knobs": ' + "[" * 200000 + "]" * 200000 + "}", "c.json"),
    ("not UTF-8", "c.yaml", "model: \udcff\udcfe\n", "c.yaml"),
    ("top-level list", "c.yaml", "- 1\n- 2\n", "expected a mapping at the top level"),
    ("python tag", "c.yaml", "model: !!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("null sections", "c.yaml", "parallel: null\nbatch: null\nknobs: null\n", "missing field 'global_batch'"),
    ("null sections but the batch", "c.yaml", "parallel: null\nbatch: {global_batch: 8}\nknobs: null\n", None),
    ("unknown field near a known one", "c.yaml", "parallel: {tpp: 2}\n", "did you mean 'tp'?"),
]


@pytest.mark.parametrize("name,fname,text,words", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_hostile_config_ends_with_one_line(tmp_path, name, fname, text, words):
    p = tmp_path / fname
    p.write_bytes(text.encode("utf-8", "surrogateescape"))
    r = run_cli("plan", "--config", str(p), "--out", str(tmp_path / "out"), "--json")
    if words is None:  # null sections are the defaults: a valid plan
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["strategies"]
        return
    assert r.returncode == 2
    one_line_error(r, words)


def test_oversized_config_file_is_refused_before_parsing(tmp_path):
    p = tmp_path / "big.yaml"
    with open(p, "w") as f:
        f.write("model: '")
        f.write("x" * (200 * 2**20))  # 200 MiB
        f.write("'\n")
    r = run_cli("simulate", "--config", str(p), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    one_line_error(r, "larger than a file may be")


RUN = {  # torchtitan Llama 3 70B on 64 A100 (fast to simulate)
    "name": "good", "source": "torchtitan docs/performance.md, row 70B: WPS 331",
    "model": "Llama-3-70B", "cluster": "dgx-a100", "nodes": 8,
    "parallel": {"dp": 64, "data_parallel": "fsdp", "recompute": "full"},
    "batch": {"global_batch": 64, "micro_batch": 1, "seq_len": 8192},
    "framework": "torchtitan", "measured": {"tokens_per_s_per_gpu": 331},
}


def _bad(name: str, **changes) -> dict:
    run = dict(copy.deepcopy(RUN), name=name)
    run.update(changes)
    return run


BAD_RUNS = [
    _bad("nodes-true", nodes=True),
    _bad("nodes-float", nodes=2.5),
    _bad("batch-1e15", batch={"global_batch": 10**15, "seq_len": 8192}),
    _bad("tp-text", parallel={"tp": "two", "dp": 32}),
    _bad("choice-10MiB", parallel={"dp": 64, "data_parallel": "y" * (2**20)}),
    _bad("assumptions-number", assumptions=[1, 2]),
]


def test_runs_file_reports_good_runs_and_lists_bad_ones(tmp_path):
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump({"runs": [RUN, *BAD_RUNS]}, sort_keys=False))
    r = run_cli("validate", str(p), "--json", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    out = json.loads(r.stdout)
    assert [row["name"] for row in out["runs"]] == ["good"]
    assert out["runs"][0]["predicted_step_time_s"] > 0
    assert len(out["invalid_runs"]) == len(BAD_RUNS)
    for bad, line in zip(BAD_RUNS, out["invalid_runs"]):
        assert f"run '{bad['name']}'" in line and "\n" not in line and len(line) < 600, line
    text = run_cli("validate", str(p), "--quiet")
    assert text.returncode == 0 and f"{len(BAD_RUNS)} run(s) of the file not read" in text.stdout


def test_runs_file_with_no_good_run_exits_2_with_one_line_and_json_object(tmp_path):
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump({"runs": BAD_RUNS}, sort_keys=False))
    r = run_cli("validate", str(p), "--json", "--quiet")
    assert r.returncode == 2
    one_line_error(r, "no run of")
    assert json.loads(r.stdout)["error"]


@pytest.mark.parametrize("text,words", [
    (f"runs: {laughs()}\n", "run #1"),
    (f"description: {laughs()}\nruns: []\n", "expected a non-empty list"),
    (f"description: {laughs()}\nruns: [{{name: a}}]\n", "description"),
    ("runs: [{name: a, assumptions: " + laughs() + "}]\n", "run 'a'"),
    ("runs: [{name: a, source: s, model: llama-3-8b, cluster: dgx-h100, parallel: {dp: " + laughs()
     + "}, batch: {global_batch: 8}, measured: {step_time_s: 1}}]\n", "parallel.dp"),
    ("runs: 3\n", "non-empty list"),
    ("runs:\n  - 7\n", "each run must be a mapping"),
], ids=["laughs as runs", "laughs as description, no runs", "laughs as description", "laughs in assumptions",
        "laughs in a degree", "runs a number", "run a number"])
def test_hostile_runs_file_ends_with_one_line(tmp_path, text, words):
    p = tmp_path / "runs.yaml"
    p.write_text(text)
    r = run_cli("validate", str(p), "--json", "--quiet")
    assert r.returncode == 2
    one_line_error(r, words)
    assert isinstance(json.loads(r.stdout), dict)  # --json prints an object, also here


# ----------------------------------------------------------------------------- in-process fuzzing

_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=6)
_FIELDS = {
    "": ["model", "cluster", "nodes", "parallel", "batch", "knobs", "framework"],
    "parallel": ["tp", "pp", "dp", "ep", "cp", "data_parallel", "sequence_parallel", "pp_schedule", "virtual_stages",
                 "recompute", "dtype_bytes", "dp_replicate", "fp8", "cp_impl"],
    "batch": ["global_batch", "micro_batch", "seq_len"],
    "knobs": ["overlap", "bucket_cap_mb", "fsdp_prefetch", "fsdp_limit_all_gathers", "tp_overlap", "tp_chunks",
              "comm_config", "comm_config_overrides", "comm_transport"],
}
_PATHS = [(sec, f) for sec, names in _FIELDS.items() for f in names]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(_PATHS), value=_values)
def test_any_value_in_any_field_is_a_workload_or_one_short_config_error(path, value):
    section, name = path
    data = {"model": "llama-3-8b", "cluster": "dgx-h100", "parallel": {"tp": 2, "dp": 4},
            "batch": {"global_batch": 8}, "knobs": {}}
    if section:
        data[section] = {**data[section], name: value}
    else:
        data[name] = value
    try:
        workload_from_mapping(data, source="fuzz")
    except ConfigError as exc:
        msg = str(exc)
        assert "\n" not in msg and len(msg) <= 2000, msg[:500]


# ------------------------------------------------------------------ the same values built in Python

_CONFIG_FIELDS = [(cls, f) for cls in (ParallelConfig, BatchConfig, OverlapKnobs)
                  for f in sorted(field_names(cls)) if f not in ("comm_config", "comm_config_overrides")]
_BASE = {BatchConfig: {"global_batch": 8}, ParallelConfig: {}, OverlapKnobs: {}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(_CONFIG_FIELDS), value=_values)
def test_a_value_built_in_python_gets_the_config_files_answer(target, value):
    """Any value in any field of a configuration: built directly in Python it is accepted or
    refused exactly as in a config file's mapping, with the same one-line message (one set of
    rules: the annotations, :func:`ccoverlap.config.check_fields`)."""
    cls, name = target
    data = {**_BASE[cls], name: value}
    try:
        from_file = dataclass_from_mapping(cls, data, "f")
    except ConfigError as exc:
        from_file = exc
    try:
        direct = cls(**data)
    except ConfigError as exc:
        direct = exc
    if isinstance(from_file, ConfigError):
        assert isinstance(direct, ConfigError), (name, value, str(from_file))
        assert str(from_file) == f"f: {direct}", (str(from_file), str(direct))
        assert "\n" not in str(direct) and len(str(direct)) <= 2000
    else:
        assert not isinstance(direct, ConfigError), (name, value, str(direct))
        assert direct == from_file


_degree = st.integers(min_value=-2, max_value=20)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["llama-3-8b", "mixtral-8x7b", "phi-2"]), tp=_degree, pp=_degree, dp=_degree,
       ep=_degree, cp=_degree, nodes=st.integers(min_value=1, max_value=4),
       global_batch=st.integers(min_value=-1, max_value=64), micro_batch=st.integers(min_value=0, max_value=4),
       seq_len=st.sampled_from([-1, 0, 3, 512, 4096]))
def test_any_layout_is_a_memory_estimate_or_one_config_error(model, tp, pp, dp, ep, cp, nodes, global_batch,
                                                              micro_batch, seq_len):
    """estimate_memory called directly with any degrees (ep > dp, pp > layers, tp not dividing
    the heads, degrees not filling the cluster, zero or negative sizes): a finite estimate, or
    one short ConfigError."""
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.catalog.models import get_model
    from ccoverlap.parallel.memory import estimate_memory

    try:
        p = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, cp=cp, sequence_parallel=tp > 1)
        b = BatchConfig(global_batch=global_batch, micro_batch=micro_batch, seq_len=seq_len)
        est = estimate_memory(get_model(model), p, b, get_cluster("dgx-h100", nodes=nodes))
    except ConfigError as exc:
        assert "\n" not in str(exc) and len(str(exc)) <= 2000
        return
    assert math.isfinite(est.total_bytes) and est.total_bytes > 0


@pytest.mark.parametrize("kind", ["directory", "fifo", "device"])
def test_a_config_path_that_is_not_a_regular_file_says_so(tmp_path, kind):
    """A directory, a FIFO or /dev/zero named as the config file was reported as 'no such file'."""
    from ccoverlap.config import read_config_file

    p = tmp_path / "c.yaml"
    if kind == "directory":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        p.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="a directory" if kind == "directory" else "not a regular file"):
        read_config_file(p)
    with pytest.raises(ConfigError, match="no such file"):
        read_config_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize("fname,text", [
    ("c.yaml", "model: llama-3-8b\ncluster: a40-pcie\nnodes: 1\nnodes: 2\n"),
    ("c.yaml", "model: llama-3-8b\nparallel:\n  dp: 8\n  dp: 16\n"),
    ("c.json", '{"model": "llama-3-8b", "cluster": "a40-pcie", "model": "phi-2"}'),
    ("c.json", '{"model": "llama-3-8b", "knobs": {"fsdp_prefetch": 1, "fsdp_prefetch": 2}}'),
])
def test_a_key_given_twice_is_refused_not_silently_the_last(tmp_path, fname, text):
    """YAML and JSON parsers keep the last of two equal keys: the job the user meant may not be
    the one predicted. TOML already refuses them."""
    from ccoverlap.config import read_config_file

    p = tmp_path / fname
    p.write_text(text)
    with pytest.raises(ConfigError, match="given twice"):
        read_config_file(p)


def test_a_yaml_merge_may_still_be_overridden(tmp_path):
    from ccoverlap.config import read_config_file

    p = tmp_path / "c.yaml"
    p.write_text("base: &b {dp: 8, tp: 1}\nparallel:\n  <<: *b\n  dp: 16\n")
    assert read_config_file(p)["parallel"] == {"dp": 16, "tp": 1}


_H200_CAL = json.loads((Path(__file__).resolve().parents[1] / "calibrations" / "h200.json").read_text())


@pytest.mark.parametrize("change,cluster,words", [
    ({}, "a40-pcie", "a calibration of 'H200', not of the cluster's A40 GPUs"),
    ({"gpu": "A40"}, "hgx-h200", "a calibration of 'A40'"),
    ({"gpu": 5}, "hgx-h200", "field 'gpu': expected a GPU name"),
    ({"version": 99}, "hgx-h200", "newer than this ccoverlap reads"),
    ({"version": "x"}, "hgx-h200", "field 'version'"),
    ({"params": {**_H200_CAL["params"], "gemm_tile_m": 10**30}}, "hgx-h200", "gemm_tile_m must be at most"),
])
def test_a_calibration_file_for_another_gpu_or_format_is_refused(tmp_path, change, cluster, words):
    """Each of these was applied silently: an H200 calibration predicted an A40 cluster, a
    version-99 file was read as version 1, a 10**30-element GEMM tile made a 5e25 s step."""
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.predict.evaluate import cost_model_for_cluster

    p = tmp_path / "cal.json"
    p.write_text(json.dumps({**_H200_CAL, **change}))
    with pytest.raises(ConfigError, match=re.escape(words)):
        cost_model_for_cluster(get_cluster(cluster), str(p))


def test_a_calibration_of_the_clusters_gpu_or_of_no_named_gpu_applies(tmp_path):
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.predict.evaluate import cost_model_for_cluster

    p = tmp_path / "cal.json"
    p.write_text(json.dumps({k: v for k, v in _H200_CAL.items() if k != "gpu"}))
    assert cost_model_for_cluster(get_cluster("a40-pcie"), str(p)).params.gemm_tile_m == _H200_CAL["params"]["gemm_tile_m"]
    h200 = cost_model_for_cluster(get_cluster("hgx-h200"), str(Path(__file__).resolve().parents[1] / "calibrations" / "h200.json"))
    assert h200.params.mem_bw_fraction == _H200_CAL["params"]["mem_bw_fraction"]


def test_a_flags_value_is_not_blamed_on_the_config_file(tmp_path, capsys):
    """``--config c.yaml --nodes 0`` said 'c.yaml: nodes must be ... got 0' of a file that says 2."""
    from ccoverlap.cli import main

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"model": "llama-3-8b", "cluster": "a40-pcie", "nodes": 2,
                                 "parallel": {"dp": 16}, "batch": {"global_batch": 32, "micro_batch": 1}}))
    assert main(["simulate", "-q", "--config", str(p), "--nodes", "0"]) == 2
    assert f"{p} + options nodes: nodes must be an integer >= 1, got 0" in capsys.readouterr().err
    p.write_text(p.read_text().replace("nodes: 2", "nodes: 0"))
    assert main(["simulate", "-q", "--config", str(p)]) == 2
    assert f"{p}: nodes must be an integer >= 1, got 0" in capsys.readouterr().err
