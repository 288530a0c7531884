"""``ccoverlap plan --emit DIR`` and ``tune --emit DIR``: every file parses back, uses only
pinned names and says what the decision says."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from ccoverlap.cli import main
from ccoverlap.nccl.apply import TUNER_COLLECTIVES, match_row, pinned_options
from ccoverlap.nccl.plan import CommKey, CommPlan
from ccoverlap.planning.emit import read_emit
from ccoverlap.planning.emit.files import MEGATRON_GROUPS
from ccoverlap.specs import CommConfig

ROOT = Path(__file__).resolve().parents[3]
A40 = str(ROOT / "examples" / "llama3-8b-fsdp-a40.yaml")


def _plan(capsys, out: Path, *argv) -> dict:
    code = main(["plan", "--json", "-q", "--out", str(out / "plan"), "--emit", str(out / "emit"), *argv])
    text, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(text)


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    """``plan --emit --json`` on the built-in example and on the Lagom paper's A40 example."""
    out = {}
    for name, argv in (("example", ()), ("a40", ("--config", A40))):
        d = tmp_path_factory.mktemp(name)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["plan", "--json", "-q", "--out", str(d / "plan"), "--emit", str(d / "emit"), *argv])
        assert code == 0
        out[name] = (json.loads(buf.getvalue()), d / "emit")
    return out


CASES = ("example", "a40")


def _row(payload: dict, name: str) -> dict:
    return next(s for s in payload["strategies"] if s["name"] == name)


def _cfg(d: dict) -> CommConfig:
    return CommConfig(**d)


@pytest.mark.parametrize("case", CASES)
def test_the_files_are_written_and_parse_back(emitted, case):
    payload, d = emitted[case]
    files = read_emit(d)
    assert {"nccl.env", "framework.json", "decision.json", "README.md"} <= {p.name for p in d.iterdir()}
    assert set(payload["emitted"]) == {p.name for p in d.iterdir()} - {"decision.json", "README.md"} | \
        {"decision.json", "README.md"}
    # the applicable row is in the table's data, after the strategy it re-simulates
    app = _row(payload, "applicable")
    assert app["decision"]["of"] == files["decision"]["strategy"] == payload["best"]
    assert files["decision"]["predicted"]["applicable_step_time_s"] == pytest.approx(app["step_time_s"])
    assert "Launch" in (d / "README.md").read_text()


@pytest.mark.parametrize("case", CASES)
def test_env_names_and_framework_keys_are_in_the_pinned_lists(emitted, case):
    _, d = emitted[case]
    files = read_emit(d)
    pinned = pinned_options()
    assert set(files["env"]) <= set(pinned["nccl"]["env"])
    fw = files["framework"]
    fsdp2 = pinned["frameworks"]["fsdp2"]
    assert set(fw["pytorch"].get("fully_shard", {})) <= set(fsdp2["fully_shard"])
    assert set(fw["pytorch"].get("ddp", {})) <= set(pinned["frameworks"]["ddp"]["keywords"])
    for keys, where in ((fw["torchtitan"]["toml"], "toml"), (fw["torchtitan"]["python"], "python")):
        assert set(keys) <= set(pinned["frameworks"]["torchtitan"][where]["keys"])
    flags = [a for a in files["megatron_args"] if a.startswith("--")]
    assert set(flags) <= set(pinned["frameworks"]["megatron-lm"]["arguments"])
    toml = files.get("torchtitan_toml", {})
    assert {f"{s}.{k}" for s, kv in toml.items() for k in kv} == set(fw["torchtitan"]["toml"])
    mg = files.get("megatron_nccl", {})
    assert set(mg) <= set(pinned["frameworks"]["megatron-lm"]["communicator_groups"])


def _applied_from_files(files: dict, comm: dict) -> dict:
    """The configuration a communication runs with, read from the files alone: the CSV row
    the example plugin matches, NCCL_NTHREADS and NCCL_BUFFSIZE, else as given."""
    key = CommKey(comm["group"], comm["collective"], comm["bytes"], comm["group_size"], comm["local_size"])
    got = dict(comm["given"])
    if files["tuner_rows"] and comm["collective"] in TUNER_COLLECTIVES:
        row = match_row(files["tuner_rows"], key)
        assert row is not None, f"no CSV row for {key}: the plugin would run it on one channel"
        got.update(algorithm=row.algorithm, protocol=row.protocol, channels=row.channels)
    env = files["env"]
    if "NCCL_NTHREADS" in env and got["protocol"] in ("simple", "ll"):
        got["threads"] = int(env["NCCL_NTHREADS"])
    if "NCCL_BUFFSIZE" in env and got["protocol"] == "simple" and got["algorithm"] == "ring":
        got["chunk_bytes"] = int(env["NCCL_BUFFSIZE"]) // 2
    return got


@pytest.mark.parametrize("case", CASES)
def test_the_nccl_files_give_every_communication_its_applied_configuration(emitted, case):
    payload, d = emitted[case]
    files = read_emit(d)
    comms = files["decision"]["communications"]
    assert comms
    for comm in comms:
        assert _applied_from_files(files, comm) == comm["applied"], comm
    # per-group CTAs span the group's applied channels
    for group, opts in files["process_groups"].items():
        chans = [c["applied"]["channels"] for c in comms if c["group"] == group]
        assert (opts["min_ctas"], opts["max_ctas"]) == (min(chans), max(chans))
        for mg in MEGATRON_GROUPS.get(group, ()):
            assert files["megatron_nccl"][mg] == {"min_ctas": opts["min_ctas"], "max_ctas": opts["max_ctas"]}


@pytest.mark.parametrize("case", CASES)
def test_the_wanted_configurations_are_the_strategys_plan(emitted, case):
    payload, d = emitted[case]
    files = read_emit(d)
    row = _row(payload, files["decision"]["strategy"])
    plan = CommPlan.from_dict(row["decision"]["comm_plan"]) if row["decision"].get("comm_plan") else CommPlan()
    assert files["decision"]["comm_plan"] == plan.to_dict()
    not_applied = "\n".join(files["decision"]["not_applied"])
    for comm in files["decision"]["communications"]:
        key = CommKey(comm["group"], comm["collective"], comm["bytes"], comm["group_size"], comm["local_size"])
        rule = next((r for r in plan.rules if r.group == key.group and r.collective == key.collective
                     and r.min_bytes <= key.nbytes < r.max_bytes), None)
        wanted = comm["wanted"]
        if rule is not None:  # every knob the plan's row sets is what is wanted
            for knob, v in vars(rule.config).items():
                if v is not None and v != "auto":
                    assert wanted[knob] == v, (key, knob)
        elif wanted != comm["given"]:  # a graph rewrite (Centauri's hierarchical collectives) without a row
            assert f"{key.group} {key.collective} {key.nbytes / 2**20:.1f} MiB" in not_applied
        if wanted != comm["applied"]:  # a difference is always listed, with why
            assert f"{key.group} {key.collective} {key.nbytes / 2**20:.1f} MiB" in not_applied


def test_framework_settings_are_the_knobs_the_strategy_changes(emitted):
    payload, d = emitted["example"]
    files = read_emit(d)
    given, row = payload["strategies"][0]["knobs"], _row(payload, payload["best"])["knobs"]
    changed = {k for k in given if given[k] != row[k] and k not in ("comm_config", "comm_config_overrides")}
    assert changed == {c["what"] for c in files["decision"]["changes"]}
    fw = files["framework"]
    if "fsdp_reshard_after_forward" in changed:
        want = row["fsdp_reshard_after_forward"]
        assert fw["pytorch"]["fully_shard"] == {"reshard_after_forward": want}
        policy = "always" if want else "never"
        assert files["torchtitan_toml"] == {"parallelism": {"fsdp_reshard_after_forward": policy}}
        assert fw["torchtitan"]["python"] == {"parallelism.fsdp_reshard_after_forward": policy}
    assert fw["tp_plan"]["layers.*.attention.wq"]["style"] == "ColwiseParallel"  # TP2 in the example


def test_emit_for_another_row_and_target(tmp_path, capsys):
    payload = _plan(capsys, tmp_path, "--strategy", "centauri", "--target", "megatron-lm")
    files = read_emit(tmp_path / "emit")
    assert files["decision"]["strategy"] == "centauri" and files["decision"]["target"] == "megatron-lm"
    app = _row(payload, "applicable")
    assert app["decision"]["of"] == "centauri"
    # Centauri's rewrites of the step have no setting anywhere: listed, and the row runs without them
    assert any(c["what"] == "rewrite" and c["why_not"] for c in files["decision"]["changes"])


@pytest.mark.parametrize("argv,needle", [
    (["--strategy", "lagomm"], "did you mean 'lagom'"),
    (["--strategy", "ficco", "--strategies", "lagom"], "'ficco' is not a row of this plan"),
    (["--target", "deepspeed"], "--target must be one of pytorch, torchtitan, megatron-lm"),
])
def test_bad_emit_flags_fail_with_one_line_before_planning(capsys, tmp_path, argv, needle):
    code = main(["plan", "-q", "--out", str(tmp_path), "--emit", str(tmp_path / "e"), *argv])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("argv", [(), ("--group", str(ROOT / "examples" / "overlap-group-tp-a40.yaml"))])
def test_tune_emits_lagoms_configurations(capsys, tmp_path, argv):
    code = main(["tune", "--json", "-q", "--emit", str(tmp_path), *argv])
    text, err = capsys.readouterr()
    assert code == 0, err
    payload = json.loads(text)
    files = read_emit(tmp_path)
    assert not (tmp_path / "framework.json").exists()  # tune changes no framework knob
    assert set(files["env"]) <= set(pinned_options()["nccl"]["env"])
    chosen = {}
    for g in payload["groups"]:
        res = g["results"]["lagom"]
        for coll, cfg, x in zip(g["communications"], res["configs"], res["comm_times_s"]):
            k = (coll["group"], coll["collective"], float(coll["bytes"]))
            if x * g["weight"] > chosen.get(k, (None, -1.0))[1]:  # where it spends the most time decides
                chosen[k] = (cfg, x * g["weight"])
    assert chosen
    comms = files["decision"]["communications"]
    for comm in comms:
        assert _applied_from_files(files, comm) == comm["applied"]
        cfg, _ = chosen.get((comm["group"], comm["collective"], float(comm["bytes"])), (None, 0))
        if cfg is not None:  # Lagom's choice is what is wanted
            for knob in ("channels", "threads", "chunk_bytes", "protocol"):
                assert comm["wanted"][knob] == cfg[knob], knob


@pytest.mark.parametrize("command", ["plan", "tune"])
def test_an_emit_path_that_is_a_file_fails_with_one_line_before_any_work(capsys, tmp_path, command):
    f = tmp_path / "taken"
    f.write_text("x")
    for target in (f, f / "below"):
        out = ["--out", str(tmp_path / "o")] if command == "plan" else []
        code = main([command, "-q", *out, "--emit", str(target)])
        _, err = capsys.readouterr()
        assert code == 2 and len(err.strip().splitlines()) == 1 and "--emit" in err and "Traceback" not in err


@pytest.mark.parametrize("name,text,needle", [
    ("nccl.env", "NCCL_NTHREADS\n", "expected NAME=value"),
    ("nccl.env", "NCCL_NOT_A_THING=1\n", "not a pinned NCCL variable"),
    ("nccl_tuner.csv", "allgather,0,10,ring,simple,4\n", "8 to 10"),
    ("framework.json", "{not json", "not JSON"),
])
def test_a_damaged_emit_directory_is_refused_naming_the_file(emitted, tmp_path, name, text, needle):
    import shutil

    from ccoverlap.errors import ConfigError

    d = tmp_path / "copy"
    shutil.copytree(emitted["example"][1], d)
    (d / name).write_text(text)
    with pytest.raises(ConfigError, match=needle) as exc:
        read_emit(d)
    assert name in str(exc.value)
    with pytest.raises(ConfigError, match="not an --emit directory"):
        read_emit(tmp_path)


def test_the_python_api_emits_and_gives_the_same_as_data(example_plan, tmp_path):
    hints = example_plan.apply_hints()
    files = example_plan.emit(tmp_path)
    back = read_emit(tmp_path)
    assert hints["strategy"] == back["decision"]["strategy"] == example_plan.applicable.decision["of"]
    assert {k: v for k, v in back["env"].items() if k != "NCCL_TUNER_CONFIG_FILE"} == hints["nccl_env"]
    assert [r.line() for r in back["tuner_rows"]] == hints["tuner_rows"]
    assert back["framework"]["tp_plan"] == hints["tp_plan"]
    assert hints["not_applied"] == back["decision"]["not_applied"]
    assert set(files) <= {p.name for p in tmp_path.iterdir()}
    other = example_plan.apply_hints("ficco", target="torchtitan")
    assert other["strategy"] == "ficco" and other["target"] == "torchtitan"
    assert any(line.startswith("tp_schedule.") for line in other["not_applied"])


def test_emit_is_refused_with_the_layout_search(capsys, tmp_path):
    code = main(["plan", "--search", "-q", "--emit", str(tmp_path / "e")])
    _, err = capsys.readouterr()
    assert code == 2 and "plan the layout --search picks, then --emit" in err
