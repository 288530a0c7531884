"""Hostile values found by an independent sweep of every input surface (the CLI and the Python
API): each ends in a result, or in one short CCOverlapError (CLI: one line, exit 2), never in
an IndexError/TypeError traceback, a silently ignored option or a user's file lost."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ccoverlap.cli import main
from ccoverlap.deciders.ficco import schedules as ficco
from ccoverlap.errors import ConfigError


def _last_error(err: str, command: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and lines, err[-500:]
    assert lines[-1].startswith(f"ccoverlap {command}: error: ") and len(lines[-1]) <= 500, lines[-1][:600]
    return lines[-1]


# ----------------------------------------------------------------------------- FiCCO: M below world

@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40), world=st.integers(2, 8),
       pattern=st.sampled_from(ficco.PATTERNS), engine=st.sampled_from(ficco.ENGINES))
def test_any_small_ficco_case_is_estimated_or_one_config_error(m, n, k, world, pattern, engine):
    cluster = ficco.machine("H100", world=8)
    try:
        case = ficco.FiccoCase(m=m, n=n, k=k, world=world, cluster=cluster, pattern=pattern, engine=engine)
    except ConfigError as exc:
        assert m < world and "at least world" in str(exc)
        return
    for schedule in ficco.SCHEDULES:
        assert len(ficco.schedule_graph(case, schedule)) > 0


def test_ficco_cli_with_fewer_rows_than_ranks_is_one_line(capsys):
    code = main(["ficco", "-q", "--m", "1", "--n", "4096", "--k", "4096", "--world", "8", "--cluster", "dgx-h100"])
    assert code == 2
    assert "at least world" in _last_error(capsys.readouterr().err, "ficco")


# ----------------------------------------------------------------------------- plan: target and emit

_W = dict(model="llama-3-8b", cluster="a40-pcie", nodes=1, dp=8, global_batch=8, micro_batch=1)


@pytest.mark.parametrize("target", ["jax", 3, None, ["pytorch"]])
def test_plan_refuses_an_unknown_target_before_the_work(target, monkeypatch):
    """An unknown target used to be swallowed: the applicable check failed silently and the plan
    recommended a strategy the user cannot set (centauri instead of lagom on this workload)."""
    import ccoverlap as cc
    from ccoverlap.predict import strategy as planner

    monkeypatch.setattr(planner.Planner, "__init__", _no_planner)
    with pytest.raises(ConfigError, match="target must be one of"):
        cc.plan(**_W, target=target)


def _no_planner(*args, **kwargs):
    raise AssertionError("the target is checked before any simulation")


@pytest.mark.parametrize("out", [5, None, 2.5, ""])
def test_plan_emit_to_a_non_path_is_a_config_error(out):
    """``PlanResult.emit(5)`` ended in os.fspath's TypeError."""
    from ccoverlap.planning.emit import write_emit

    with pytest.raises(ConfigError, match="expected the path of a directory"):
        write_emit(None, out)


# ----------------------------------------------------------------------------- validate --write-calibration

def test_write_calibration_without_fit_is_an_error_not_ignored(tmp_path, capsys):
    """It used to print the comparison, exit 0 and write nothing."""
    out = tmp_path / "c.json"
    code = main(["validate", "published", "-q", "--subset", "fit", "--write-calibration", str(out)])
    assert code == 2 and not out.exists()
    assert "give --fit and --fit-on" in _last_error(capsys.readouterr().err, "validate")


def test_no_command_is_one_line_on_stderr_after_the_help(capsys):
    """Exit 2 used to come with the help on stdout and nothing on stderr: a script saw a failure
    with no reason."""
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert "COMMAND" in out and err.strip() == "ccoverlap: error: no command given; `ccoverlap --help` lists them"


@pytest.mark.parametrize("name,words", [("publshed", "no such runs file (did you mean 'published'?)"),
                                        ("nope", "no such runs file")])
def test_a_runs_file_name_without_suffix_that_is_not_there(name, words, tmp_path, monkeypatch):
    """A mistyped 'published' was 'unknown config format ''', which names the wrong problem."""
    import ccoverlap as cc

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(words)):
        cc.validate(name)
