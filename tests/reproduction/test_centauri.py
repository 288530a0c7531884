"""Centauri's reproduction cases: the case file, the evaluator's baselines and its errors, and the
choices the paper describes (§5.2), on the whole Centauri file (a few seconds)."""

from __future__ import annotations

import re

import pytest

from ccoverlap.errors import ConfigError
from ccoverlap.reproduction import centauri as cen
from ccoverlap.reproduction.suite import Case, load_cases, run_suite

CASES, TITLES = load_cases(["centauri"])
BY_ID = {c.id: c for c in CASES}


@pytest.fixture(scope="module")
def rows():
    res = run_suite(["centauri"], jobs=1)
    return {r.case.id: r for r in res.rows}


def test_case_file_covers_the_papers_settings():
    counted = [c for c in CASES if c.paper_speedup is not None]
    assert len(counted) >= 5 and sum(c.headline for c in CASES) == 1
    for c in CASES:
        assert re.search(r"(Fig\.|Table|§|Abstract)", c.source), c.id
        assert c.quote and c.method == "centauri"
        spec = cen.Spec(**{k: v for k, v in c.spec.items() if k != "settings"},
                        settings=[cen.Setting(**s) for s in c.spec["settings"]])
        for s in spec.settings:
            assert s.baseline in cen.BASELINES, c.id
    # the settings the evaluation names: FSDP, DP, FSDP+DP, TP+PP+DP, two clusters
    layouts = set()
    for c in CASES:
        for s in c.spec["settings"]:
            for _, w in cen.expand(cen.Setting(**s)):
                p = w["parallel"]
                layouts.add((p.get("data_parallel", "ddp"), p.get("dp_replicate", 1) > 1, p.get("pp", 1) > 1,
                             w["cluster"]["name"]))
    assert {(False, True), (True, False)} <= {(r, pp) for _, r, pp, _ in layouts}
    assert {"ddp", "fsdp"} <= {d for d, *_ in layouts}
    assert {"centauri-cluster-a", "centauri-cluster-b"} <= {c for *_, c in layouts}


def test_every_baseline_says_where_it_comes_from():
    for name, b in cen.BASELINES.items():
        assert len(b.source) > 60 and b.summary, name
        assert b.knobs or b.parallel, name


def test_headline_is_reproduced_in_a_named_setting(rows):
    r = rows["hybrid-max"]
    assert r.verdict == "match", r.to_dict()
    best = max(r.outcome.extra["settings"], key=lambda s: s["speedup"] if s["baseline_fits"] else 0)
    assert best["setting"].split()[0] in ("DP3+FSDP16", "DP6+FSDP8", "DP12+FSDP4", "TP4+PP3+DP4")  # §5.2's
    assert r.outcome.ours_speedup == pytest.approx(best["speedup"])


def test_pipeline_group_as_the_paper_chose_it(rows):
    # §5.2: "TP4+PP3+DP4+BS4 ... with a PP depth size of micro-batches"; small batch: "6"
    assert "pipeline group L=3" in rows["tp4-pp3-dp4-bs4"].outcome.detail
    assert "pipeline group L=6" in rows["tp4-pp3-dp4-bs1"].outcome.detail


def test_centauri_never_loses_to_its_baseline(rows):
    for r in rows.values():
        for s in r.outcome.extra["settings"]:
            assert s["speedup"] >= 1.0 - 1e-9, (r.case.id, s)


def test_the_no_prefetch_reading_of_zero3_leaves_more_to_gain(rows):
    for a, b in (("fsdp16-large-bs8", "fsdp16-large-bs8-on-demand"),
                 ("clusterb-fsdp256-big-bs4", "clusterb-fsdp256-big-bs4-on-demand"),
                 ("single-parallel-max", "single-parallel-max-on-demand")):
        assert rows[b].outcome.ours_speedup > rows[a].outcome.ours_speedup


def test_deepspeeds_own_runtime_hides_more_at_batch_8(rows):
    """DeepSpeed's hooks run ahead on the host: at batch 8 its gathers wait for no computation,
    so its step is shorter than with hooks in step with the GPU, and Centauri gains less."""
    ahead, hooks = rows["fsdp16-large-bs8-deepspeed"].outcome, rows["fsdp16-large-bs8"].outcome
    assert ahead.extra["settings"][0]["baseline_ms"] < 0.97 * hooks.extra["settings"][0]["baseline_ms"]
    assert 1.0 <= ahead.ours_speedup < hooks.ours_speedup
    assert "zero3_host_ahead" in cen.BASELINES["zero3-deepspeed"].knobs


def _case(spec: dict) -> Case:
    return Case(id="bad", setting="s", source="Fig. 0", quote="q", method="centauri", baseline="b",
                paper_speedup=1.2, spec=spec, paper="centauri")


WORKLOAD = dict(BY_ID["fsdp16-large-bs8"].spec["settings"][0]["workload"])


@pytest.mark.parametrize("spec, needle", [
    ({"settings": [{"workload": WORKLOAD, "baseline": "zero9"}]}, "unknown Centauri baseline 'zero9'"),
    ({"settings": [{"workload": {**WORKLOAD, "batch": {"global_batch": 16, "micro_batch": 1}},
                    "baseline": "zero3"}]}, "not global_batch"),
    ({"settings": [{"workload": WORKLOAD, "baseline": "zero3", "extra": 1}]}, "bad: spec"),
    ({"settings": [{"workload": WORKLOAD, "baseline": "zero3", "vary": {"batch.micro_batch": [1, 2]}}]},
     "2 settings; give aggregate: max"),
    ({"settings": [{"workload": {**WORKLOAD, "parallel": {"dp": 16, "data_parallel": "fsdp", "dp_replicate": 1}},
                    "baseline": "zero123"}]}, "needs dp_replicate > 1"),
])
def test_bad_specs_name_what_is_wrong(spec, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        cen.evaluate(_case(spec))


def test_expand_fills_the_global_batch_and_labels_layouts():
    s = cen.Setting(workload={"parallel": {"dp": 48, "data_parallel": "fsdp"}, "batch": {"micro_batch": 2}},
                    baseline="zero123", microbatches=3,
                    vary={"parallel": [{"dp": 48, "data_parallel": "fsdp", "dp_replicate": 6}],
                          "batch.micro_batch": [1, 4]})
    got = cen.expand(s)
    assert [label for label, _ in got] == ["DP6+FSDP8 micro_batch=1", "DP6+FSDP8 micro_batch=4"]
    one = cen.expand(cen.Setting(workload={"parallel": {"tp": 4, "pp": 3, "dp": 4}, "batch": {}}, baseline="x"))
    assert one[0][0] == "TP4+PP3+DP4" and one[0][1]["batch"]["global_batch"] == 4
    assert [w["batch"]["global_batch"] for _, w in got] == [48 * 1 * 3, 48 * 4 * 3]
