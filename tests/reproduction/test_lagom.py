"""Lagom's cases of the reproduction suite (ccoverlap/data/reproduce/lagom.yaml): the whole
file evaluated once (about 10 s of CPU), then what must hold in every setting."""

from __future__ import annotations

import json

import pytest

from ccoverlap.errors import ConfigError
from ccoverlap.reproduction import lagom as L
from ccoverlap.reproduction.suite import Case, load_cases, run_suite


@pytest.fixture(scope="module")
def suite():
    return run_suite(["lagom"], jobs=1)


def test_every_case_evaluates(suite):
    assert not [r.case.id for r in suite.rows if r.error]
    kinds = {r.case.spec["kind"] for r in suite.rows}
    assert kinds == {"step", "range", "group", "contention"}
    counted = [r for r in suite.rows if r.expressible]
    assert len(counted) >= 14 and all(r.outcome.ours_speedup > 0 for r in counted)
    settings = [r for r in suite.rows if r.case.spec["kind"] == "step"]
    assert len(settings) >= 5


def test_lagom_never_below_nccl_and_within_one_percent_of_autoccl_everywhere(suite):
    """In every Lagom setting, both methods from the baseline's framework knobs: Lagom is
    never slower than NCCL's defaults and never more than 1% slower than AutoCCL."""
    for r in suite.rows:
        if r.case.spec["kind"] != "step":
            continue
        t = r.outcome.extra
        assert t["lagom"] <= t["nccl"] * (1 + 1e-9), r.case.id
        assert t["lagom"] <= t["autoccl"] * 1.01, (r.case.id, t)


def test_nccl_defaults_leave_less_than_the_papers_tp_gain_on_pcie_all_reduces():
    """Why the TP ranges miss (docs/seeds.md): on cluster B (a40-pcie) an 8-GPU all-reduce of
    16-256 MiB at NCCL's defaults is within 8% -- the paper's smallest TP gain -- of the best
    channel count, chunk size and protocol at 64-256 MiB, 8.4% at 16 MiB (the A40's PCIe
    efficiency is measured, 0.87: microsoft/vidur's 8 x A40 all-reduce), yet not already the
    best (there is something to tune). A change to the PCIe channel model that opens more
    headroom fails here, and the seeds page's explanation must change with it."""
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.cost.comm import collective_profile
    from ccoverlap.cost.params import default_params
    from ccoverlap.specs import CollectiveSpec, CommConfig, GroupSpec

    cluster = get_cluster("a40-pcie")
    params = default_params(cluster.gpu)
    group = GroupSpec(name="tp", size=8, local_size=8)

    def seconds(nbytes, **knobs):
        spec = CollectiveSpec(collective="all_reduce", bytes=nbytes, group=group, config=CommConfig(**knobs))
        return collective_profile(spec, cluster, params).time_s

    for mib in (16, 64, 256):
        nbytes = mib << 20
        default = seconds(nbytes)
        best = min(seconds(nbytes, channels=nc, chunk_bytes=kib << 10, protocol=proto)
                   for nc in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
                   for kib in (32, 64, 128, 256, 512, 1024, 2048, 4096) for proto in ("simple", "ll"))
        assert 1.0 < default / best < (1.085 if mib == 16 else 1.08), (mib, default / best)


def test_cases_quote_the_paper(suite):
    for r in suite.rows:
        c = r.case
        assert c.quote and c.setting and c.method and c.baseline, c.id
        assert any(tag in c.source for tag in ("Fig.", "Table", "§", "abstract")), c.id
        if c.spec["kind"] == "step":
            assert c.paper_speedup is None  # the per-setting bars are not in the paper's text
        else:
            assert c.paper_speedup is not None, c.id
    assert sum(1 for r in suite.rows if r.case.headline) == 1


def test_headline_is_a_named_setting(suite):
    head = next(r for r in suite.rows if r.case.headline)
    assert head.case.paper_speedup == 1.33
    assert "at fsdp-" in head.outcome.detail  # the setting where ccoverlap's largest gain is


def _fake_times(ratios):
    def fake(workload_json: str):
        wl = json.loads(workload_json)
        r = ratios[(wl["model"], wl["nodes"], str(wl["cluster"])[:20])]
        return {"nccl": r, "lagom": 1.0, "autoccl": 1.0, "lagom_plan": "", "describe": ""}
    return fake


def test_range_cases_take_the_smallest_and_largest_setting(monkeypatch):
    cases = {c.id: c for c in load_cases(["lagom"])[0]}
    ids = ["ep-deepseek-b", "ep-olmoe-b"]
    ratios = {(cases[i].spec["workload"]["model"], cases[i].spec["workload"]["nodes"],
               str(cases[i].spec["workload"]["cluster"])[:20]): v for i, v in zip(ids, (1.2, 1.05))}
    monkeypatch.setattr(L, "step_times", _fake_times(ratios))
    low = L.evaluate(cases["ep-range-low"])
    high = L.evaluate(cases["ep-range-high"])
    assert low.ours_speedup == pytest.approx(1.05) and "ep-olmoe-b" in low.detail.split(":")[0]
    assert high.ours_speedup == pytest.approx(1.2) and "ep-deepseek-b" in high.detail.split(":")[0]


@pytest.mark.parametrize("spec, message", [
    ({"kind": "nope"}, "spec.kind must be one of"),
    ({"kind": "range", "settings": ["fsdp-phi2-a"]}, "pick: min\\|max"),
    ({"kind": "range", "pick": "min", "settings": ["no-such-case"]}, "not step cases"),
    ({"kind": "range", "pick": "min", "settings": ["fig3-nc16-vs-nc32"]}, "not step cases"),
    ({"kind": "step"}, "needs a 'workload' mapping"),
    ({"kind": "step", "compare": "lagom/centauri", "workload": {"model": "phi-2"}}, "compare must be one of"),
    ({"kind": "contention", "cluster": "a40-pcie"}, "contention spec"),
])
def test_malformed_specs_name_what_is_wrong(spec, message):
    case = Case(id="x", setting="s", source="Fig. 1", quote="q", method="m", baseline="b", spec=spec, paper="lagom")
    with pytest.raises(ConfigError, match=message):
        L.evaluate(case)


def test_command_prints_one_case(capsys):
    from ccoverlap.cli import main

    assert main(["reproduce", "--paper", "lagom", "--case", "fig3-nc16-vs-nc32", "--markdown", "-q"]) == 0
    out = capsys.readouterr().out
    assert "| lagom | fig3-nc16-vs-nc32 | Fig. 3(b), §3.2 |" in out and "1.30x" in out
