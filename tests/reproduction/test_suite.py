"""The reproduction suite's core: case files, the match rule, the table, bad files."""

import json

import pytest

from ccoverlap.errors import ConfigError
from ccoverlap.reproduction.report import markdown, summary_lines
from ccoverlap.reproduction.suite import Outcome, load_cases, run_suite

CASES = """
paper: lagom
title: A test paper
reference: a venue
cases:
  - id: near
    setting: s1
    source: Fig. 1
    quote: "1.20x"
    method: m
    baseline: b
    paper_speedup: 1.20
    headline: true
    spec: {ours: 1.15}
  - id: far
    setting: s2
    source: Table 2
    quote: "1.20x"
    method: m
    baseline: b
    paper_speedup: 1.20
    spec: {ours: 1.05}
  - id: slower
    setting: s3
    source: Sec. 3
    quote: "3.9x slower"
    method: m
    baseline: b
    paper_speedup: 0.2564
    spec: {ours: 0.2273}
  - id: unmodelled
    setting: s4
    source: Fig. 4
    quote: "n/a"
    method: m
    baseline: b
    paper_speedup: 1.3
    expressible: false
    why_not: not in the model
"""


def _fake(case):
    if "ours" not in case.spec:
        raise ConfigError(f"{case.id}: spec needs 'ours'")
    return Outcome(ours_speedup=case.spec["ours"], detail="fake")


def _write(tmp_path, text=CASES):
    (tmp_path / "lagom.yaml").write_text(text)
    return tmp_path


def test_match_rule_and_summary(tmp_path):
    res = run_suite(["lagom"], evaluators={"lagom": _fake}, data_dir=_write(tmp_path))
    verdicts = {r.case.id: r.verdict for r in res.rows}
    # 1.15 vs 1.20: gain 0.15 vs 0.20, off by 0.05 <= 0.06 -> match; 1.05: off by 0.15 -> miss
    assert verdicts == {"near": "match", "far": "miss", "slower": "match", "unmodelled": "not expressible"}
    near = next(r for r in res.rows if r.case.id == "near")
    assert near.gain_ratio == pytest.approx(0.75)
    s = res.summary()["all"]
    assert (s["cases"], s["expressible"], s["matches"], s["headline_matches"]) == (4, 3, 2, 1)
    assert "2 of 3 expressible" in summary_lines(res)[-1]
    md = markdown(res)
    assert "| lagom | near * | Fig. 1 |" in md and "not in the model" in md
    json.dumps(res.to_dict())  # JSON-ready


def test_case_errors_become_rows(tmp_path):
    bad = CASES.replace("spec: {ours: 1.05}", "spec: {}")
    res = run_suite(["lagom"], evaluators={"lagom": _fake}, data_dir=_write(tmp_path, bad))
    far = next(r for r in res.rows if r.case.id == "far")
    assert far.verdict == "error" and "needs 'ours'" in far.error
    assert res.summary()["all"]["expressible"] == 2


@pytest.mark.parametrize("text, needle", [
    (CASES.replace("paper_speedup: 1.20\n    headline", "paper_speedup: fast\n    headline"), "lagom.yaml"),
    (CASES.replace("id: far", "id: near"), "duplicate case id"),
    (CASES.replace("paper: lagom", "paper: other"), "lagom.yaml"),
    (CASES + "\nextra: 1\n", "lagom.yaml"),
    ("cases: [", "lagom.yaml"),
])
def test_malformed_files_name_the_file(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_cases(["lagom"], _write(tmp_path, text))


def test_unknown_paper_and_case(tmp_path):
    with pytest.raises(ConfigError, match="unknown paper"):
        load_cases(["nope"], _write(tmp_path))
    with pytest.raises(ConfigError, match="unknown case"):
        run_suite(["lagom"], ids=["nope"], evaluators={"lagom": _fake}, data_dir=_write(tmp_path))


def test_command_lists_every_paper():
    from ccoverlap.commands.reproduce import PAPER_NAMES
    from ccoverlap.reproduction.suite import PAPERS

    assert sorted(PAPERS) == list(PAPER_NAMES)


def test_fit_cases_are_shown_but_never_counted(tmp_path):
    """A case a parameter was fitted on matches by construction: verdict 'fit', out of the count."""
    text = CASES.replace("    spec: {ours: 1.05}", "    fit: true\n    spec: {ours: 1.05}")
    res = run_suite(["lagom"], evaluators={"lagom": _fake}, data_dir=_write(tmp_path, text))
    far = next(r for r in res.rows if r.case.id == "far")
    assert far.verdict == "fit" and far.matches is None and far.outcome.ours_speedup == 1.05
    s = res.summary()["all"]
    assert (s["cases"], s["expressible"], s["matches"], s["fit"]) == (4, 2, 2, 1)
    assert "1 fit case, not counted" in summary_lines(res)[0]
    assert "| fit |" in markdown(res)
