"""benchmarks/torchtitan_h200.yaml (torchtitan's H200 benchmark, an out-of-sample set never fitted
on) and the torchtitan-compile-2025 framework profile it uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ccoverlap.catalog import frameworks
from ccoverlap.catalog.frameworks import get_framework
from ccoverlap.cli import main
from ccoverlap.validation.reader import load_runs

RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_h200.yaml"
PROFILE = Path(frameworks.__file__).resolve().parents[1] / "data" / "frameworks" / "torchtitan-compile-2025.yaml"


def test_runs_file_cites_pinned_commits_and_is_never_fitted_on():
    spec = load_runs(RUNS)
    runs = {r.name: r for r in spec.runs}
    assert set(runs) == {"torchtitan-llama3.1-8b-fsdp-fp8-h200x32", "torchtitan-llama3.1-8b-fsdp-fp8-h200x64"}
    raw = yaml.safe_load(RUNS.read_text())["sources"]
    assert "cbccb387871a5e1f522c1e222c51ab88b03c0392" in raw["TT-H200"]  # pytorch/torchtitan
    assert "e7c0cae934df78d6e9c2835f42ff1f757dc3fddc" in raw["TT-E7C0CAE"]  # pytorch/torchtitan
    for r in runs.values():
        assert r.subset is None and r.framework == "torchtitan-compile-2025" and r.assumptions
        assert r.source.startswith("[TT-H200]: NUM_NODES ")
    # tokens/s/GPU -> step time: 2 sequences of 8192 tokens per GPU per step
    assert runs["torchtitan-llama3.1-8b-fsdp-fp8-h200x32"].measured_step_time_s == pytest.approx(2 * 8192 / 10938)
    assert runs["torchtitan-llama3.1-8b-fsdp-fp8-h200x64"].measurement.memory_gib == 46.97


def test_memory_estimate_against_the_stated_peaks(capsys):
    """The memory estimate (nothing in it fitted) against the two peaks the benchmark states."""
    assert main(["validate", str(RUNS), "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    for r in out["runs"]:
        assert r["problem"] is None and r["predicted_step_time_s"] > 0
        assert abs(r["memory_error_pct"]) < 10.0, r["name"]
    assert out["memory_summary"]["runs_predicted"] == 2


def test_profile_changes_only_the_entries_it_lists():
    listed = set(yaml.safe_load(PROFILE.read_text())["entries"])
    assert listed == {"loss_bytes_per_logit", "cross_entropy_fused", "optimizer_bytes_per_param"}
    base, fw = get_framework("torchtitan-compile"), get_framework("torchtitan-compile-2025")
    b, f = base.to_dict(), fw.to_dict()
    assert {k for k in f if k not in ("name", "description") and f[k] != b[k]} == listed
    assert fw.loss_bytes_per_logit < base.loss_bytes_per_logit  # the compiled loss keeps less
    for key in listed:
        assert "pytorch/torchtitan" in fw.sources[key] and "at e7c0cae" in fw.sources[key], key
