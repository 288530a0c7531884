"""One convention across commands: the shared flags on every command, usage errors with the
usage line and the closest flag or name, a quiet exit on a closed pipe, ``ccoverlap list``,
``plan --search`` honouring or refusing layout flags, and whole cells at 80 columns."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ccoverlap.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "fixtures" / "traces"
PICTURES = ("plan", "simulate", "analyze", "replay")  # the commands that draw
WORKLOAD = ("plan", "simulate", "tune")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


def test_every_command_has_the_shared_flags():
    subs = _subparsers()
    assert set(subs) == set(COMMANDS)
    for name, p in subs.items():
        flags = _flags(p)
        assert "--json" in flags, name
        if name == "list":
            continue
        assert flags.get("-q") is flags.get("--quiet") is not None, name
        assert flags["--quiet"].help == "no progress and no warnings on stderr", name
        if name in PICTURES:
            assert flags["--png"].nargs == "?" and flags["--png"].default is None, name  # opt-in
            assert flags["--no-png"].help == argparse.SUPPRESS, name
        else:
            assert "--png" not in flags, name
        if name in WORKLOAD or name in ("replay", "ficco"):
            assert "--cluster" in flags, name
        if "--out" in flags:
            assert flags["--out"].metavar == "DIR", name
        if "--dtype" in flags:
            assert set(flags["--dtype"].choices) <= {"bfloat16", "float16", "float32", "fp8"}, name
    assert "--dtype" in _flags(subs["ficco"]) and _flags(subs["ficco"])["--dtype-bytes"].help == argparse.SUPPRESS
    assert _flags(subs["ficco"])["--gpu"].dest == "cluster"


def test_misspelled_flag_gets_the_usage_line_and_the_closest_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--modle", "llama-3-8b"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ccoverlap plan ")
    assert "ccoverlap plan: error: unrecognized arguments: --modle (did you mean --model?)" in err


@pytest.mark.parametrize("argv,words", [
    (["plna"], "did you mean 'plan'?"),
    (["plan", "--pp-schedule", "1f1bb"], "did you mean '1f1b'?"),
    (["list", "modles"], "did you mean 'models'?"),
])
def test_invalid_choices_get_the_closest_one(capsys, argv, words):
    with pytest.raises(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and words in err


@pytest.mark.parametrize("argv,words", [
    (["plan", "--cluster", "dgx-h1000"], "unknown cluster 'dgx-h1000' (did you mean 'dgx-h100'?); clusters: dgx-h100"),
    (["plan", "--model", "llama-3-8"], "(did you mean"),
    (["plan", "--strategies", "lagon"], "unknown strategy 'lagon' (did you mean 'lagom'?)"),
    (["plan", "--knob", "fsdp_prefetc=2"], "(did you mean 'fsdp_prefetch'?)"),
    (["plan", "--framework", "torchtitn"], "(did you mean 'torchtitan'?)"),
    (["ficco", "--cluster", "H10-SXM"], "(did you mean 'H100-SXM'?)"),
])
def test_unknown_names_get_the_closest_one_in_one_line(capsys, tmp_path, argv, words):
    assert main([*argv, "--out", str(tmp_path)] if argv[0] == "plan" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err, err


def test_list_prints_the_names_other_commands_take(capsys):
    from ccoverlap.catalog.hardware import CLUSTERS, GPUS

    assert main(["list", "clusters", "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)["clusters"]] == list(CLUSTERS)
    assert main(["list", "gpus"]) == 0
    out = capsys.readouterr().out
    assert all(g in out for g in GPUS)
    for what in ("models", "frameworks", "strategies"):
        assert main(["list", what]) == 0
        assert len(capsys.readouterr().out.splitlines()) >= 3


def test_closed_pipe_ends_quietly_with_exit_0():
    """The reader goes away before the command writes (``| head -1`` that already has its line)."""
    p = subprocess.Popen([sys.executable, "-m", "ccoverlap", "analyze", str(TRACES / "gloo_tpdp_4rank"), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_head_of_a_pipe_in_a_shell():
    cmd = f"{sys.executable} -m ccoverlap analyze {TRACES / 'gloo_tpdp_4rank'} | head -1; exit ${{PIPESTATUS[0]}}"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stdout.splitlines()) == 1


def test_plan_search_honours_given_degrees(capsys, tmp_path):
    assert main(["plan", "--search", "--tp", "8", "--max-simulations", "3", "--top", "1", "--json", "-q",
                 "--out", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranked"] and all(r["parallel"]["tp"] == 8 for r in doc["ranked"] + doc["not_simulated"])
    assert main(["plan", "--search", "--recompute", "full", "--data-parallel", "fsdp", "--max-simulations", "2",
                 "--top", "0", "--json", "-q", "--out", str(tmp_path)]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert all(r["parallel"]["recompute"] == "full" and r["parallel"]["data_parallel"] == "fsdp" for r in ranked)


def test_plan_search_refuses_flags_it_cannot_keep(capsys, tmp_path):
    assert main(["plan", "--search", "--tp", "2", "--virtual-stages", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--virtual-stages" in err
    assert main(["plan", "--search", "--tp", "3", "--out", str(tmp_path)]) == 2
    assert "no legal layout" in capsys.readouterr().err and "tp=3" in err + "tp=3"


def test_no_picture_unless_asked(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--out", str(out), "-q"]) == 0
    assert not list(out.glob("*.png"))
    assert main(["simulate", "--out", str(out), "--png", "-q", "--no-png"]) == 0  # --no-png: ignored
    assert (out / "simulate.png").is_file()


def test_key_columns_whole_at_80_columns(tmp_path):
    env = dict(os.environ, COLUMNS="80")
    r = subprocess.run([sys.executable, "-m", "ccoverlap", "plan", "--out", str(tmp_path), "-q"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for name in ("as-given", "no-overlap", "best-knobs", "lagom", "centauri"):
        row = next(line for line in lines if line.split() and line.split()[0] == name)
        assert row.split()[-1].endswith("x") and "…" not in row, row  # the speedup cell, whole


@pytest.mark.parametrize("argv", [["plan", "--tp", "3"], ["simulate", "--model", "nope"], ["ficco", "--m", "0"],
                                  ["validate", "missing.yaml"], ["tune", "--group", "missing.yaml"]])
def test_json_prints_one_object_also_on_failure(capsys, tmp_path, argv):
    assert main([*argv, "--json"]) == 2
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert isinstance(doc, dict) and doc["error"] in cap.err


def test_analyze_command_imports_no_catalog_or_planner():
    # analyze reads traces: building its parser must not load the model catalog or the planner
    code = ("import sys, ccoverlap.commands.analyze as a, argparse; a.register(argparse.ArgumentParser().add_subparsers()); "
            "print(sorted(m for m in sys.modules if m.startswith(('ccoverlap.catalog', 'ccoverlap.predict'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
