"""benchmarks/megatron_bridge_h100.yaml (Megatron-Bridge's DGX-H100 rows, an out-of-sample set never
fitted on) and the megatron-bridge framework profile it uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ccoverlap.catalog.frameworks import get_framework
from ccoverlap.cli import main
from ccoverlap.validation.reader import load_runs

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "benchmarks" / "megatron_bridge_h100.yaml"
PROFILE = ROOT / "ccoverlap" / "data" / "frameworks" / "megatron-bridge.yaml"


def test_runs_file_loads_cites_pinned_commits_and_is_never_fitted_on():
    spec = load_runs(RUNS)
    runs = {r.name: r for r in spec.runs}
    assert len(runs) == 4
    for r in runs.values():
        assert r.subset is None  # an out-of-sample test: no fit / held-out split
        # the table and the recipe it cites, each at its commit
        assert r.source.startswith("[MB-SUMMARY] at 067f987df0: ")
        assert "[MB-2511] at 97ad8cc6fb: " in r.source or "[MB-2604] at 21d102f5ec: " in r.source
        assert r.framework == "megatron-bridge" and r.parallel["fp8"] is True and r.assumptions
    # the three sources name full 40-hex commits
    raw = yaml.safe_load(RUNS.read_text())["sources"]
    for key, commit in (("MB-SUMMARY", "067f987df03b8355b03192d88d70f1709fedf51a"),
                        ("MB-2511", "97ad8cc6fb27a58bb79ff51ce73897c3887aa2c6"),
                        ("MB-2604", "21d102f5ecbaa9307bb7eb0a9b0850cdf2f4bbd6")):
        assert commit in raw[key]
    # tokens/s/GPU -> step time: GBS x seq / (GPUs x tokens/s/GPU)
    r = runs["mbridge-llama3-70b-fp8cs-gbs128-h100x64"]
    assert r.measured_step_time_s == pytest.approx(128 * 8192 / (64 * 1602))
    r = runs["mbridge-llama31-405b-fp8cs-gbs1536-h100x1024"]
    assert r.measured_step_time_s == pytest.approx(1536 * 8192 / (1024 * 328))


def test_two_runs_are_predicted_without_a_problem(capsys):
    names = ["mbridge-llama3-70b-fp8cs-gbs128-h100x64", "mbridge-llama3-70b-fp8cs-gbs256-h100x64"]
    argv = ["validate", str(RUNS), "--json", "--quiet"]
    for n in names:
        argv += ["--run", n]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in out["runs"]}
    assert set(rows) == set(names)
    for r in rows.values():
        assert r["problem"] is None
        assert r["predicted_step_time_s"] > 0 and r["compute_s"] > 0
    assert out["summary"]["runs_predicted"] == 2


def test_profile_differs_from_megatron_core_only_in_the_entries_it_lists():
    listed = set(yaml.safe_load(PROFILE.read_text())["entries"])
    assert listed == {"ddp_reduce_dtype", "fsdp_reduce_dtype", "ddp_grad_prescale", "ddp_grad_nan_check",
                      "cross_entropy_fused"}
    base, fw = get_framework("megatron-core"), get_framework("megatron-bridge")
    assert fw.name == "megatron-bridge"
    b, f = base.to_dict(), fw.to_dict()
    changed = {k for k in f if k not in ("name", "description") and f[k] != b[k]}
    assert changed == listed  # every listed entry changes a value, nothing else does
    for key in set(fw.sources) - listed:
        assert fw.sources[key] == base.sources[key], key
    for key in listed:
        assert "Megatron-Bridge" in fw.sources[key] or "performance recipes" in fw.sources[key], key
