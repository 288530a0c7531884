"""Framework settings for the knobs a strategy changes, and which of them a framework can set.

For each framework knob a decision changes (:meth:`Decision.knob_changes`), its layout changes,
step rewrites and TP schedules, this module says how each target sets it, with option names
from the pinned list (``ccoverlap/data/emit/options.yaml``, each with its source file and
commit):

* ``pytorch``: FSDP2 ``fully_shard`` keywords and ``FSDPModule`` prefetch methods, DDP's
  ``bucket_cap_mb``, and the TP plan as ccoverlap's ParallelStyles
  (:mod:`ccoverlap.runtime.tp`, schedules of :mod:`ccoverlap.runtime.schedules`);
* ``torchtitan``: its job-config keys (TOML, and the same names in its Python configuration);
* ``megatron-lm``: command-line arguments.

A knob a target cannot set is *dropped* for that target: the applicable row
(:mod:`ccoverlap.planning.emit.applicable`) re-simulates the strategy with the value as given.
What the frameworks do by default counts as settable with nothing to write (FSDP2 prefetches
the next unit in forward and backward, DDP and FSDP2 reduce gradients during backward,
pipeline sends and receives are asynchronous).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import pinned_options

if TYPE_CHECKING:
    from ccoverlap.parallel.config import OverlapKnobs
    from ccoverlap.predict.workload import Workload

    from .decision import Decision

TARGETS = ("pytorch", "torchtitan", "megatron-lm")

#: the step builders' TP pair names -> (module names in torchtitan's Llama, style class)
TP_MODULES = {
    "qkv": (("attention.wq", "attention.wk", "attention.wv"), "ColwiseParallel"),
    "proj": (("attention.wo",), "RowwiseParallel"),
    "mlp_fc1": (("feed_forward.w1", "feed_forward.w3"), "ColwiseParallel"),
    "mlp_fc2": (("feed_forward.w2",), "RowwiseParallel"),
    "lm_head": (("output",), "ColwiseParallel"),
}

#: how each target sets one knob's change: ``rule(change, workload as given) -> {target: Outcome}``
KnobRule = Callable[["Change", "Workload"], "dict[str, Outcome]"]


@dataclass(frozen=True)
class Change:
    """One thing a strategy changes: ``what`` (a knob, ``parallel.<field>``, ``rewrite`` or
    ``tp_schedule.<pair>``), the value as given and the strategy's."""

    what: str
    given: Any  # a knob's or a layout field's value (bool, int, float, str), or text
    wanted: Any


@dataclass
class Outcome:
    """How one target sets a :class:`Change`: ``settings`` (``{place: {key: value}}``), the
    value it then runs with (``applied``) and, when that is not the wanted value, why."""

    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    applied: Any = None  # the value of the knob or field it runs with
    why: str = ""


@dataclass
class FrameworkSettings:
    """Per target: the settings to write, the value each change runs with, and the drops."""

    target: str
    changes: list[Change]
    outcomes: dict[str, dict[str, Outcome]]  # target -> change.what -> outcome
    tp_plan: dict[str, dict[str, Any]] | None = None

    def settings(self, target: str) -> dict[str, dict[str, Any]]:
        """``{place: {key: value}}`` merged over the changes (places: ``fully_shard``,
        ``fsdp2_prefetch``, ``ddp``, ``torchtitan.toml``, ``torchtitan.python``, ``megatron``)."""
        out: dict[str, dict[str, Any]] = {}
        for o in self.outcomes[target].values():
            for place, kv in o.settings.items():
                out.setdefault(place, {}).update(kv)
        return out

    def dropped(self, target: str | None = None) -> list[tuple[Change, Outcome]]:
        """The changes ``target`` (default: the chosen one) cannot make, with why."""
        t = target or self.target
        return [(c, self.outcomes[t][c.what]) for c in self.changes if self.outcomes[t][c.what].why]


# ----------------------------------------------------------------------------- one knob

def _default(value: Any) -> Outcome:
    return Outcome({}, value)


def _drop(given: Any, why: str) -> Outcome:
    return Outcome({}, given, why)


def _reshard(c: Change, w: Workload) -> dict[str, Outcome]:
    policy = "always" if c.wanted else "never"
    tt = {"parallelism.fsdp_reshard_after_forward": policy}
    return {"pytorch": Outcome({"fully_shard": {"reshard_after_forward": bool(c.wanted)}}, c.wanted),
            "torchtitan": Outcome({"torchtitan.toml": tt, "torchtitan.python": tt}, c.wanted),
            "megatron-lm": _drop(c.given, "Megatron-LM has no reshard-after-forward argument")}


def _prefetch(c: Change, w: Workload) -> dict[str, Outcome]:
    v = int(c.wanted)
    if v == 1:
        py = _default(v)  # FSDP2's implicit prefetch of the next unit
    elif v == 0:
        py = _drop(c.given, "FSDP2 always prefetches the next unit; nothing turns it off")
    else:
        py = Outcome({"fsdp2_prefetch": {"forward": v, "backward": v}}, v)
    why = "no configuration key for the FSDP prefetch depth"
    return {"pytorch": py, "torchtitan": _default(v) if v == 1 else _drop(c.given, "torchtitan has " + why),
            "megatron-lm": _drop(c.given, "Megatron-LM has " + why)}


def _bucket(c: Change, w: Workload) -> dict[str, Outcome]:
    mib = float(c.wanted)
    params = int(round(mib * 2**20 / w.parallel.dtype_bytes))
    return {"pytorch": Outcome({"ddp": {"bucket_cap_mb": mib}}, c.wanted),
            "torchtitan": _drop(c.given, "torchtitan's DDP (replicate) has no bucket-size key"),
            "megatron-lm": Outcome({"megatron": {"--ddp-bucket-size": params}}, c.wanted)}


def _flag_megatron(flag: str, on_value: bool, pytorch_default: bool, what: str) -> KnobRule:
    """A boolean knob Megatron-LM sets with ``flag`` when the knob is ``on_value``; PyTorch
    (and torchtitan on it) always runs ``pytorch_default``."""
    def rule(c: Change, w: Workload) -> dict[str, Outcome]:
        mg = Outcome({"megatron": {flag: True}}, c.wanted) if c.wanted == on_value else _default(c.wanted)
        py = _default(c.wanted) if c.wanted == pytorch_default else _drop(c.given, what)
        return {"pytorch": py, "torchtitan": py, "megatron-lm": mg}
    return rule


def _ep(c: Change, w: Workload) -> dict[str, Outcome]:
    why = "no expert-parallel all-to-all overlap setting"
    mg = Outcome({"megatron": {"--overlap-moe-expert-parallel-comm": True}}, True) if c.wanted else _default(False)
    return {"pytorch": _drop(c.given, "PyTorch has " + why) if c.wanted else _default(False),
            "torchtitan": _drop(c.given, "torchtitan has " + why + " outside DualPipeV") if c.wanted
            else _default(False), "megatron-lm": mg}


def _nowhere(why: str) -> KnobRule:
    def rule(c: Change, w: Workload) -> dict[str, Outcome]:
        return {t: _drop(c.given, why) for t in TARGETS}
    return rule


KNOB_RULES: dict[str, KnobRule] = {
    "fsdp_reshard_after_forward": _reshard,
    "fsdp_prefetch": _prefetch,
    "bucket_cap_mb": _bucket,
    "overlap_grad_reduce": _flag_megatron("--overlap-grad-reduce", True, True,
                                          "DDP and FSDP2 always reduce gradients during backward"),
    "overlap_param_gather": _flag_megatron("--overlap-param-gather", True, False,
                                           "PyTorch has no sharded optimizer whose parameter all-gather it overlaps"),
    "pp_p2p_overlap": _flag_megatron("--no-overlap-p2p-communication", False, True,
                                     "torch.distributed.pipelining always sends and receives asynchronously"),
    "ep_overlap": _ep,
    "overlap": _nowhere("no framework setting turns every overlap off or on at once"),
    "fsdp_fetch": _nowhere("unit or per-parameter gathering is the framework itself (FSDP or DeepSpeed ZeRO-3)"),
    "fsdp_limit_all_gathers": _nowhere("FSDP2 has no limit on all-gathers in flight (FSDP1's limit_all_gathers "
                                       "is on or off, not a count)"),
    "comm_transport": _nowhere("NCCL's collectives run on SMs; copy-engine transfers are only in ccoverlap's "
                               "TP styles (comm_engine='dma')"),
}


# ----------------------------------------------------------------------------- tensor parallelism

def _tp_style_args(knobs: OverlapKnobs, tp: int) -> tuple[dict[str, str], str]:
    """(``schedule``/``comm_engine`` for ccoverlap's styles from the TP knobs, why tp_chunks is
    not what the style runs, or "")."""
    if knobs.tp_overlap == "none":
        return {"schedule": "serial", "comm_engine": "sm"}, ""
    if knobs.tp_overlap == "symm_mem":
        return {"schedule": "ring", "comm_engine": "dma"}, ""
    why = "" if knobs.tp_chunks == tp else \
        f"the styles' ring schedule runs one piece per TP rank ({tp}), not tp_chunks={knobs.tp_chunks}"
    return {"schedule": "ring", "comm_engine": "sm"}, why


def _tp_outcomes(c_overlap: Change | None, c_chunks: Change | None, knobs: OverlapKnobs, given_knobs: OverlapKnobs,
                 tp: int) -> dict[str, dict[str, Outcome]]:
    """Outcomes of the TP knobs per target (keyed by the change's ``what``)."""
    out: dict[str, dict[str, Outcome]] = {}
    _, why_chunks = _tp_style_args(knobs, tp)
    mode = knobs.tp_overlap
    if c_overlap is not None:
        tt = {"parallelism.enable_async_tensor_parallel": mode == "symm_mem"}
        ttp = {"compile.enable_async_tensor_parallel": mode == "symm_mem"}
        if mode == "symm_mem":
            tt["compile.enable"] = ttp["compile.enable"] = True
        out[c_overlap.what] = {
            "pytorch": Outcome({"tp_plan": {"tp_overlap": mode}}, mode),
            "torchtitan": Outcome({"torchtitan.toml": tt, "torchtitan.python": ttp}, mode) if mode != "chunked"
            else _drop(c_overlap.given, "torchtitan's TP overlap is async TP (symmetric memory) only"),
            "megatron-lm": Outcome({"megatron": {"--tp-comm-overlap": True}}, mode) if mode == "chunked"
            else (_default(mode) if mode == "none" else
                  _drop(c_overlap.given, "Megatron-LM's TP overlap is --tp-comm-overlap (chunked, TransformerEngine)"))}
    if c_chunks is not None:
        applied = tp if why_chunks else knobs.tp_chunks
        out[c_chunks.what] = {
            "pytorch": Outcome({}, applied, why_chunks) if why_chunks else _default(applied),
            "torchtitan": _drop(c_chunks.given, "torchtitan has no TP chunk count"),
            "megatron-lm": _drop(c_chunks.given, "Megatron-LM's chunking follows its TransformerEngine overlap config")}
    return out


def tp_plan(w: Workload, knobs: OverlapKnobs, schedules: Mapping[str, Mapping[str, Any]] | None = None
            ) -> dict[str, dict[str, Any]] | None:
    """The TP plan for ``parallelize_module`` as plain data, in torchtitan's Llama module names
    (``layers.*.attention.wq``, ...): ``{module: {"style": class name, arguments...}}`` with
    placements as strings (``"Shard(1)"``, ``"Replicate()"``); ccoverlap's styles
    (:mod:`ccoverlap.runtime.tp`) with the ``schedule`` / ``comm_engine`` the knobs, or a
    FiCCO schedule per pair (``schedules``), give. None without tensor parallelism."""
    p = w.parallel
    if p.tp <= 1:
        return None
    base, _ = _tp_style_args(knobs, p.tp)
    per_pair = {name: {"schedule": s["schedule"], "comm_engine": s.get("engine", "sm")}
                for name, s in (schedules or {}).items()}
    sp = p.sequence_parallel
    plan: dict[str, dict[str, Any]] = {}
    if sp:
        plan["tok_embeddings"] = {"style": "RowwiseParallel", "input_layouts": "Replicate()", "output_layouts": "Shard(1)"}
        plan["norm"] = {"style": "SequenceParallel"}
        for part in ("attention", "feed_forward"):
            plan[f"layers.*.{'attention_norm' if part == 'attention' else 'ffn_norm'}"] = {"style": "SequenceParallel"}
            plan[f"layers.*.{part}"] = {"style": "PrepareModuleInput", "input_layouts": ["Shard(1)"],
                                        "desired_input_layouts": ["Replicate()"]}
    for pair, (modules, style) in TP_MODULES.items():
        args = dict(base, **per_pair.get(pair, {}))
        for m in modules:
            key = m if pair == "lm_head" else f"layers.*.{m}"
            entry = {"style": style, **args}
            if sp and style == "RowwiseParallel":
                entry["output_layouts"] = "Shard(1)"
            if pair == "lm_head":
                entry.update({"input_layouts": "Shard(1)" if sp else "Replicate()", "output_layouts": "Replicate()"})
            plan[key] = entry
    return plan


# ----------------------------------------------------------------------------- all changes

def framework_settings(decision: Decision, target: str = "pytorch") -> FrameworkSettings:
    """How each target sets what ``decision`` changes (:class:`FrameworkSettings`); ``target``
    is the one the applicable row and the README lead with."""
    if target not in TARGETS:
        raise ConfigError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    w, k = decision.given, decision.knobs
    changes: list[Change] = []
    outcomes: dict[str, dict[str, Outcome]] = {t: {} for t in TARGETS}

    def add(change: Change, per_target: dict[str, Outcome]) -> None:
        changes.append(change)
        for t in TARGETS:
            outcomes[t][change.what] = per_target[t]

    knob_changes = decision.knob_changes()
    tp_over = Change("tp_overlap", *knob_changes.pop("tp_overlap")) if "tp_overlap" in knob_changes else None
    tp_chunks = Change("tp_chunks", *knob_changes.pop("tp_chunks")) if "tp_chunks" in knob_changes else None
    for name, (given, wanted) in knob_changes.items():
        rule = KNOB_RULES.get(name)
        if rule is None:
            raise ConfigError(f"no emit rule for knob {name!r}")  # a new knob needs its rule
        add(Change(name, given, wanted), rule(Change(name, given, wanted), w))
    for what, per in _tp_outcomes(tp_over, tp_chunks, k, w.knobs, w.parallel.tp).items():
        change = tp_over if what == "tp_overlap" else tp_chunks
        assert change is not None  # _tp_outcomes keys only the changes it was given
        add(change, per)
    for name, (given, wanted) in decision.parallel_changes().items():
        c = Change(f"parallel.{name}", given, wanted)
        if name == "distributed_optimizer" and wanted:
            add(c, {"pytorch": _drop(given, "PyTorch's DDP has no sharded optimizer with reduce-scatter + "
                                            "all-gather of the gradients"),
                    "torchtitan": _drop(given, "torchtitan has no distributed optimizer"),
                    "megatron-lm": Outcome({"megatron": {"--use-distributed-optimizer": True}}, wanted)})
        else:
            add(c, {t: _drop(given, f"no {t} setting for the layout field {name}") for t in TARGETS})
    for text in decision.rewrites:
        add(Change("rewrite", "", text), {t: _drop("", "a rewrite of the step no framework setting expresses")
                                          for t in TARGETS})
    for pair, s in sorted(decision.tp_schedules.items()):
        c = Change(f"tp_schedule.{pair}", "", f"{s['schedule']} ({s.get('engine', 'sm')})")
        add(c, {"pytorch": Outcome({"tp_plan": {pair: s["schedule"]}}, c.wanted),
                "torchtitan": _drop("", "torchtitan's TP styles have no per-layer overlap schedule"),
                "megatron-lm": _drop("", "Megatron-LM has no per-layer TP overlap schedule")})
    fs = FrameworkSettings(target, changes, outcomes)
    fs.tp_plan = tp_plan(w, k, decision.tp_schedules)
    _check_pinned(fs)
    return fs


def applied_knobs(decision: Decision, fs: FrameworkSettings) -> tuple[OverlapKnobs, dict[str, Any]]:
    """The knobs the target of ``fs`` runs: the knobs as given with every change it can make
    (TP chunks as its styles run them), NCCL configurations as given (they go through NCCL's
    own settings), and the layout fields it can change."""
    w = decision.given
    o = fs.outcomes[fs.target]
    kw: dict[str, Any] = {}
    for c in fs.changes:
        if c.what in KNOB_RULES or c.what in ("tp_overlap", "tp_chunks"):
            kw[c.what] = o[c.what].applied
    knobs = replace(w.knobs, **kw)
    parallel = {c.what.split(".", 1)[1]: o[c.what].applied for c in fs.changes
                if c.what.startswith("parallel.") and not o[c.what].why}
    return knobs, parallel


def _check_pinned(fs: FrameworkSettings) -> None:
    """Every key a setting names is in the pinned list (ccoverlap/data/emit/options.yaml)."""
    pinned = pinned_options()["frameworks"]
    allowed = {
        "fully_shard": set(pinned["fsdp2"]["fully_shard"]),
        "fsdp2_prefetch": {"forward", "backward"},  # FSDPModule.set_modules_to_{forward,backward}_prefetch
        "ddp": set(pinned["ddp"]["keywords"]),
        "torchtitan.toml": set(pinned["torchtitan"]["toml"]["keys"]),
        "torchtitan.python": set(pinned["torchtitan"]["python"]["keys"]),
        "megatron": set(pinned["megatron-lm"]["arguments"]),
        "tp_plan": {"tp_overlap", *TP_MODULES},
    }
    for t in TARGETS:
        for place, kv in fs.settings(t).items():
            bad = set(kv) - allowed[place]
            if bad:
                raise ConfigError(f"{t} setting {place}.{sorted(bad)[0]} is not in the pinned option list")
