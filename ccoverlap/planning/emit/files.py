"""The files of ``--emit DIR`` and the same data in Python (:func:`hints`).

``write_emit`` writes, for one :class:`~.applicable.EmitBundle`:

* ``nccl.env``: process-wide ``NCCL_*`` variables (``NAME=value`` lines, shell-sourceable);
* ``nccl_tuner.csv``: the example tuner plugin's rows, when algorithm, protocol or channels
  change per collective, size or group;
* ``process_groups.json``: ``ProcessGroupNCCL.Options`` min / max CTAs per process group,
  and ``megatron_nccl.yaml``: the same for Megatron-LM's ``--nccl-communicator-config-path``;
* ``framework.json``: the settings per framework (FSDP2 / DDP keywords, torchtitan keys,
  Megatron-LM arguments) and the TP plan for ccoverlap's ParallelStyles; ``torchtitan.toml``
  and ``megatron_args.txt`` when those frameworks have something to set;
* ``decision.json``: everything above with the decision it came from (per communication:
  wanted, as given, applied; the changes not applied and why; the predictions);
* ``README.md``: how to launch with these files, in plain words.

:func:`read_emit` reads a directory back (parsed, validated against the pinned formats).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ccoverlap.config import read_config_file, short
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import nccl_env_text, parse_nccl_env, parse_tuner_csv, tuner_csv_text
from ccoverlap.outputs import atomic_dir

from .frameworks import TARGETS
from .readme import readme_text

if TYPE_CHECKING:
    from ccoverlap.nccl.apply import GroupOptions
    from ccoverlap.predict.evaluate import StrategyResult

    from .applicable import EmitBundle

__all__ = ["write_emit", "read_emit", "hints", "MEGATRON_GROUPS"]

#: ccoverlap's process-group names -> Megatron-LM's (parallel_state.get_nccl_options keys)
MEGATRON_GROUPS = {"dp": ("dp", "dp_cp"), "tp": ("tp",), "pp": ("pp",), "cp": ("cp",), "ep": ("ep",),
                   "edp": ("ep_dp",)}


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def _toml(keys: Mapping[str, object]) -> str:
    """``{"section.key": value}`` as TOML sections."""
    sections: dict[str, list[str]] = {}
    for dotted, v in keys.items():
        sec, _, name = dotted.rpartition(".")
        sections.setdefault(sec, []).append(f"{name} = {_toml_value(v)}")
    return "\n".join(f"[{sec}]\n" + "\n".join(lines) + "\n" for sec, lines in sections.items())


def _megatron_args(settings: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for flag, v in settings.items():
        out.extend([flag] if v is True else [flag, str(v)])
    return out


def hints(b: EmitBundle) -> dict[str, Any]:
    """Everything ``--emit`` writes, as plain data (``PlanResult.apply_hints()``)."""
    fs, n = b.framework, b.nccl
    frameworks: dict[str, dict[str, Any]] = {}
    for t in TARGETS:
        s = fs.settings(t) if fs else {}
        frameworks[t] = {"settings": s, "not_applied": [f"{c.what}: {o.why}" for c, o in fs.dropped(t)] if fs else []}
    megatron = frameworks["megatron-lm"]["settings"].get("megatron", {})
    return {
        "strategy": b.strategy,
        "target": b.target,
        "nccl_env": dict(n.env),
        "tuner_rows": [r.line() for r in n.tuner_rows],
        "process_groups": {g: o.to_dict() for g, o in n.groups.items()},
        "fully_shard": frameworks["pytorch"]["settings"].get("fully_shard", {}),
        "fsdp2_prefetch": frameworks["pytorch"]["settings"].get("fsdp2_prefetch", {}),
        "ddp": frameworks["pytorch"]["settings"].get("ddp", {}),
        "torchtitan": {"toml": frameworks["torchtitan"]["settings"].get("torchtitan.toml", {}),
                       "python": frameworks["torchtitan"]["settings"].get("torchtitan.python", {})},
        "megatron_args": _megatron_args(megatron),
        "tp_plan": fs.tp_plan if fs else None,
        "frameworks": frameworks,
        "not_applied": b.dropped_lines(),
        "everything_applies": b.everything_applies,
    }


def _communications(b: EmitBundle) -> list[dict[str, Any]]:
    rows = []
    for k in sorted(b.weights, key=lambda k: -b.weights[k]):
        rows.append({"group": k.group, "collective": k.collective, "bytes": k.nbytes, "group_size": k.group_size,
                     "local_size": k.local_size, "seconds": b.weights[k], "wanted": asdict(b.wanted[k]),
                     "given": asdict(b.given[k]), "applied": asdict(b.nccl.applied[k])})
    return rows


def _predicted(b: EmitBundle, as_given: StrategyResult | None) -> dict[str, float]:
    out = {}
    if as_given is not None:
        out["as_given_step_time_s"] = as_given.step_time_s
    if b.ideal is not None:
        out["strategy_step_time_s"] = b.ideal.step_time_s
    if b.applicable is not None:
        out["applicable_step_time_s"] = b.applicable.step_time_s
    return out


def write_emit(b: EmitBundle, out_dir: str | os.PathLike[str], *, as_given: StrategyResult | None = None, source: str = "", command: str = "ccoverlap plan --emit") -> dict[str, str]:
    """Write the files of the module docstring for bundle ``b`` into ``out_dir`` (created);
    ``as_given``: the as-given StrategyResult (for the README's numbers); ``command``: what
    wrote them (README). A bundle of NCCL configurations alone gets no framework files.
    Every file is built first, then the set is written at once
    (:func:`ccoverlap.outputs.atomic_dir`): when anything fails, ``out_dir`` is left as it was.
    Returns ``{file name: path}``."""
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir):
        raise ConfigError(f"emit: expected the path of a directory, got {short(out_dir)}")
    out = Path(out_dir)
    texts = emit_texts(b, out, as_given=as_given, source=source, command=command)
    with atomic_dir(out) as tmp:
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
    return {name: str(out / name) for name in texts}


def emit_texts(b: EmitBundle, out: Path, *, as_given: StrategyResult | None = None, source: str = "", command: str = "ccoverlap plan --emit"
               ) -> dict[str, str]:
    """``{file name: text}`` of every file :func:`write_emit` writes into ``out`` (nothing is
    written here); ConfigError when one cannot be built."""
    h = hints(b)
    texts: dict[str, str] = {}
    env = dict(b.nccl.env)
    why = dict(b.nccl.env_why)
    if b.nccl.tuner_rows:
        env["NCCL_TUNER_CONFIG_FILE"] = str((out / "nccl_tuner.csv").resolve())
        why["NCCL_TUNER_CONFIG_FILE"] = ("the example tuner plugin's CSV (set NCCL_TUNER_PLUGIN to the plugin "
                                         "you built: README.md)")
        texts["nccl_tuner.csv"] = tuner_csv_text(b.nccl.tuner_rows, header=(
            f"ccoverlap: '{b.strategy}' for {b.description}\n"
            "for NCCL's example tuner plugin (plugins/tuner/example); bytes inclusive; every call of the step "
            "has a row"))
    texts["nccl.env"] = nccl_env_text(env, why, header=(
        f"ccoverlap: process-wide NCCL settings for '{b.strategy}'"
        + ("" if env else "\nnothing to set: the decision keeps NCCL's process-wide defaults")))
    if b.nccl.groups:
        texts["process_groups.json"] = json.dumps(h["process_groups"], indent=2) + "\n"
        texts["megatron_nccl.yaml"] = _megatron_yaml(b.nccl.groups)
    if b.framework is not None:
        fw = {"target": b.target, "pytorch": {k: h[k] for k in ("fully_shard", "fsdp2_prefetch", "ddp") if h[k]},
              "tp_plan": h["tp_plan"], "torchtitan": h["torchtitan"], "megatron_lm": {"args": h["megatron_args"]}}
        texts["framework.json"] = json.dumps(fw, indent=2) + "\n"
    tt = h["torchtitan"]["toml"]
    if tt:
        texts["torchtitan.toml"] = _toml(tt)
    margs = list(h["megatron_args"])
    if b.nccl.groups:
        margs += ["--nccl-communicator-config-path", str((out / "megatron_nccl.yaml").resolve())]
    if margs:
        texts["megatron_args.txt"] = " ".join(margs) + "\n"
    written = {name: str(out / name) for name in texts}
    changes = [] if b.framework is None else [
        {"what": c.what, "given": c.given, "wanted": c.wanted, "applied": b.framework.outcomes[b.target][c.what].applied,
         "why_not": b.framework.outcomes[b.target][c.what].why} for c in b.framework.changes]
    decision = {"strategy": b.strategy, "target": b.target, "for": b.description,
                "source": source, "predicted": _predicted(b, as_given), "changes": changes,
                "comm_plan": (b.decision.comm_plan if b.decision else b.plan).to_dict(),
                "communications": _communications(b),
                "nccl": {"env": b.nccl.env, "tuner_rows": h["tuner_rows"], "process_groups": h["process_groups"]},
                "frameworks": h["frameworks"], "not_applied": h["not_applied"],
                "everything_applies": h["everything_applies"], "files": sorted([*written, "decision.json", "README.md"])}
    texts["decision.json"] = json.dumps(decision, indent=2, default=str) + "\n"
    texts["README.md"] = readme_text(b, written, as_given=as_given, command=command)
    return texts


def _megatron_yaml(groups: Mapping[str, GroupOptions]) -> str:
    data = {}
    for name, o in groups.items():
        for mg in MEGATRON_GROUPS.get(name, ()):
            data[mg] = {"min_ctas": o.min_ctas, "max_ctas": o.max_ctas}
    head = "# ccoverlap: min/max CTAs per Megatron-LM process group (--nccl-communicator-config-path)\n"
    return head + (yaml.safe_dump(data, sort_keys=True) if data else "{}\n")


def read_emit(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The files of an ``--emit`` directory, parsed and validated: ``env`` (nccl.env),
    ``tuner_rows`` (:class:`~ccoverlap.nccl.apply.TunerRow` list), ``process_groups``,
    ``megatron_nccl``, ``framework``, ``torchtitan_toml``, ``megatron_args``, ``decision``.
    ConfigError naming the file on anything malformed."""
    d = Path(out_dir)
    if not (d / "decision.json").is_file():
        raise ConfigError(f"{d}: not an --emit directory (no decision.json)")
    out: dict[str, Any] = {"env": parse_nccl_env((d / "nccl.env").read_text(), str(d / "nccl.env"))}
    out["tuner_rows"] = parse_tuner_csv((d / "nccl_tuner.csv").read_text(), str(d / "nccl_tuner.csv")) \
        if (d / "nccl_tuner.csv").is_file() else []
    for name, key in (("process_groups.json", "process_groups"), ("framework.json", "framework"),
                      ("decision.json", "decision")):
        p = d / name
        try:
            out[key] = json.loads(p.read_text()) if p.is_file() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}: not JSON ({exc})") from None
    if (d / "megatron_nccl.yaml").is_file():
        out["megatron_nccl"] = yaml.safe_load((d / "megatron_nccl.yaml").read_text()) or {}
    if (d / "torchtitan.toml").is_file():
        out["torchtitan_toml"] = read_config_file(d / "torchtitan.toml")
    out["megatron_args"] = (d / "megatron_args.txt").read_text().split() if (d / "megatron_args.txt").is_file() \
        else []
    return out
