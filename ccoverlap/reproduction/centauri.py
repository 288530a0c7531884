"""Centauri's evaluation (Chen et al., ASPLOS '24, §5) as ccoverlap comparisons.

A case's ``spec`` names one or more *settings*; each setting is a workload template (the
config-file schema of :mod:`ccoverlap.predict.workload` without ``global_batch``, which is
``dp × micro_batch × microbatches``), the paper's baseline it is compared with (a name in
:data:`BASELINES`) and optionally ``vary``: lists of values for dotted keys of the template
(``model``, ``parallel``, ``batch.micro_batch``, ...), whose product gives the settings.
``aggregate: max`` compares the largest speedup over all settings with a figure the paper
states as "up to"; otherwise the case has exactly one setting.

Per setting: the baseline is the workload with the baseline's knobs (both sides share the
framework profile, model, batch and every knob the baseline does not name); Centauri is
:func:`ccoverlap.deciders.centauri.decide.decide` on that same workload, whose tiers replace the
baseline's scheduling with Centauri's (its reducer, optimizer and pipeline scheduler, §4) and
add its partitions. The speedup is the baseline's step time over Centauri's. A setting whose
baseline does not fit in memory is left out of a maximum (the paper omits its OOM runs, §5.1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ccoverlap.errors import ConfigError
from ccoverlap.reproduction.suite import Case, Outcome

if TYPE_CHECKING:
    from ccoverlap.deciders.centauri.decide import CentauriDecision

__all__ = ["BASELINES", "Baseline", "Setting", "Spec", "expand", "compare", "evaluate", "baseline_for"]


@dataclass(frozen=True)
class Baseline:
    """One of the paper's baselines as it ran them (§5 "Baseline": "the fundamental
    methodologies of listed baselines are transposed onto Megatron-LM"): the knobs and the
    parallel-config changes that express it, and where each comes from."""

    summary: str
    knobs: dict
    parallel: dict
    source: str


BASELINES: dict[str, Baseline] = {
    "zero3": Baseline(
        summary="ZeRO-3 (gathers at the hooks)",
        knobs={"fsdp_fetch": "parameter"},
        parallel={},
        source="ZeRO-3 transposed onto Megatron-LM (§5 'Baseline'), scheduled as the paper draws it (Fig. 1 a, "
               "Fig. 3: all-gather B beside MatMul A): DeepSpeed v0.9.0's fetch order and default sizes (April "
               "2023, the paper's PyTorch 2.0 / NCCL 2.14 era; zero/config.py) -- parameters gathered per tensor "
               "at each submodule's hook, the next ones prefetched up to stage3_prefetch_bucket_size=5e7 "
               "elements, tensors under 1e5 elements never gathered, gradients reduce-scattered in "
               "reduce_bucket_size=5e8-element buckets -- each hook run as the computation reaches it; gathers "
               "and reduce-scatters on the data-parallel group's one communicator"),
    "zero3-deepspeed": Baseline(
        summary="ZeRO-3 as DeepSpeed runs it",
        knobs={"fsdp_fetch": "parameter", "zero3_host_ahead": True},
        parallel={},
        source="DeepSpeed v0.9.0's own runtime (partitioned_param_coordinator.py fetch_sub_module): the hooks run on "
               "the host, whose only waits in forward and backward are for all-gathers (the third outstanding "
               "fetch event) and reduce-scatters (the third outstanding reduce event); its all-gather stream never "
               "waits for the compute stream, so the all-gathers run ahead of the computation up to "
               "stage3_max_live_parameters=1e9 elements, queued on the data-parallel communicator with the "
               "gradient buckets' reduce-scatters in the host's order"),
    "zero3-on-demand": Baseline(
        summary="ZeRO-3 without prefetch",
        knobs={"fsdp_fetch": "unit", "fsdp_prefetch": 0},
        parallel={},
        source="the paper's own account of ZeRO (Table 1: partitions primitives and workload, no overlap "
               "scheduling; Fig. 1 a: weights gathered before the MatMuls): every all-gather issued when its "
               "computation needs it, the reduce-scatters still on their own stream"),
    "zero2": Baseline(
        summary="ZeRO-1/2 (DeepSpeed defaults)",
        knobs={"overlap_grad_reduce": False, "overlap_param_gather": False},
        parallel={"distributed_optimizer": True, "shard_gradients": True},
        source="DeepSpeed v0.9.0 stages 1-2: gradients reduce-scattered, optimizer states partitioned, updated "
               "partitions all-gathered at the end of step(); overlap_comm defaults to false below stage 3, so the "
               "reductions run on the compute stream (zero/config.py overlap_comm_valid, stage_1_and_2.py); "
               "stage 2 keeps each rank's gradient partition only (stage_1_and_2.py partition_gradients)"),
    "zero123": Baseline(
        summary="ZeRO-3 (gathers at the hooks) in the FSDP group + ZeRO-1/2 across the DP replicas",
        knobs={"fsdp_fetch": "parameter", "overlap_param_gather": False},
        parallel={"distributed_optimizer": True},
        source="§5.2 'Zero1+2+3 baselines': ZeRO-3 as 'zero3' inside each FSDP group; across the DP replicas the "
               "gradient shard is reduce-scattered on the reduce stream (stage 3's overlap_comm) and the updated "
               "shard all-gathered after the optimizer step (ZeRO-1, DeepSpeed stage_1_and_2.py step)"),
    "megatron-lm": Baseline(
        summary="Megatron-LM e6d7e09",
        knobs={"overlap_grad_reduce": False, "pp_p2p_overlap": False},
        parallel={"distributed_optimizer": False, "pp_group": 0},
        source="Megatron-LM e6d7e09 (May 2023, §5 'Testbed'): local DDP all-reduces each model chunk's contiguous "
               "gradient buffer in reduce_model_grads after forward_backward_func (no --overlap-grad-reduce yet), "
               "--use-distributed-optimizer and --overlap-p2p-communication off by default, the interleaved "
               "schedule launching pp micro-batches per model chunk (megatron/arguments.py, training.py, "
               "optimizer/optimizer.py, model/distributed.py)"),
}


class Setting(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A workload template, the baseline it is compared with, optional variations."""

    workload: dict[str, Any]
    baseline: str
    microbatches: int = 1
    vary: dict[str, list] = msgspec.field(default_factory=dict)


class Spec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    settings: list[Setting]
    aggregate: Literal["one", "max"] = "one"


@dataclass
class Result:
    """One setting's comparison (seconds)."""

    label: str
    baseline_s: float
    centauri_s: float
    baseline_fits: bool
    note: str

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.centauri_s


def baseline_for(name: str) -> Baseline:
    """The named baseline (ConfigError listing the known ones)."""
    if name not in BASELINES:
        raise ConfigError(f"unknown Centauri baseline {name!r}; known: {', '.join(BASELINES)}")
    return BASELINES[name]


def _set(mapping: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``mapping`` with the dotted key ``dotted`` (``parallel.tp``) set to ``value`` (copies, the original untouched)."""
    out = dict(mapping)
    head, _, rest = dotted.partition(".")
    out[head] = _set(dict(out.get(head) or {}), rest, value) if rest else value
    return out


def _label(value: object) -> str:
    """A short name for a varied value: a model's name, a layout as DP3+FSDP16 / TP4+PP3+DP4."""
    if not isinstance(value, dict):
        return str(value)
    if "name" in value:
        return str(value["name"])
    dims = [f"{k.upper()}{value[k]}" for k in ("tp", "pp") if int(value.get(k, 1)) > 1]
    dp, r = int(value.get("dp", 1)), int(value.get("dp_replicate", 1))
    if value.get("data_parallel") == "fsdp":
        dims.append(f"DP{r}+FSDP{dp // r}" if r > 1 else f"FSDP{dp}")
    elif dp > 1:
        dims.append(f"DP{dp}")
    return "+".join(dims) or "1 GPU"


def expand(setting: Setting) -> list[tuple[str, dict[str, Any]]]:
    """The workload mappings of a setting: its template with every combination of ``vary``,
    ``global_batch`` filled in; each labelled with its layout and the other values that vary."""
    keys = list(setting.vary)
    out: list[tuple[str, dict[str, Any]]] = []
    for combo in itertools.product(*(setting.vary[k] for k in keys)):
        w = setting.workload
        for k, v in zip(keys, combo):
            w = _set(w, k, v)
        par, batch = dict(w.get("parallel") or {}), dict(w.get("batch") or {})
        if "global_batch" in batch:
            raise ConfigError("a Centauri setting gives micro_batch and microbatches, not global_batch")
        batch["global_batch"] = int(par.get("dp", 1)) * int(batch.get("micro_batch", 1)) * setting.microbatches
        w = {**w, "batch": batch}
        parts = [_label(v) if isinstance(v, dict) else f"{k.split('.')[-1]}={v}" for k, v in zip(keys, combo)
                 if k != "parallel"]
        out.append((" ".join([_label(w.get("parallel") or {})] + parts), w))
    return out


def compare(label: str, mapping: dict[str, Any], baseline: str) -> Result:
    """Baseline ``baseline`` and Centauri on the workload ``mapping`` (simulated, exact)."""
    from ccoverlap.deciders.centauri.decide import decide
    from ccoverlap.predict.strategy import Planner
    from ccoverlap.predict.workload import workload_from_mapping

    b = baseline_for(baseline)
    m = dict(mapping)
    m["knobs"] = {**(m.get("knobs") or {}), **b.knobs}
    m["parallel"] = {**(m.get("parallel") or {}), **b.parallel}
    w = workload_from_mapping(m, source=label or "setting")
    planner = Planner(w, jobs=1, exact=True)
    base = planner.evaluate(w)
    d = decide(planner, w)
    return Result(label=label, baseline_s=base.step_time_s, centauri_s=d.step_s, baseline_fits=base.fits_memory,
                  note=_choices(d))


def _choices(d: CentauriDecision) -> str:
    """Centauri's choices in a few words: the tiers that changed something, and alpha."""
    parts = []
    if d.scheduling != "as given":
        parts.append("its runtime scheduling")
    for v in (d.primitive, d.group):
        if v not in ("as given", "flat"):
            parts.append(v)
    if d.operation != "none":
        parts.append(f"operation: {d.operation.split(' per all-gather')[0]}")
    if d.layer.startswith("T2"):
        parts.append("backward T2")
    if d.pipeline_group:
        parts.append(f"pipeline group L={d.pipeline_group}")
    elif d.model != (1, 1):
        parts.append(f"L1={d.model[0]}, L2={d.model[1]}")
    if d.defer_units:
        parts.append(f"last {d.defer_units} reduce-scatters deferred")
    return f"{'; '.join(parts) or 'nothing beats the baseline'} (alpha {d.alpha:.2f})"


def evaluate(case: Case) -> Outcome:
    """ccoverlap's speedup of Centauri over the case's baseline (the largest over its settings
    with ``aggregate: max``). A malformed spec raises ConfigError naming the case."""
    try:
        spec = msgspec.convert(case.spec, Spec)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{case.id}: spec: {exc}") from None
    runs: list[tuple[str, Result]] = []
    for s in spec.settings:
        for label, mapping in expand(s):
            runs.append((s.baseline, compare(label, mapping, s.baseline)))
    if spec.aggregate == "one":
        if len(runs) != 1:
            raise ConfigError(f"{case.id}: {len(runs)} settings; give aggregate: max or one setting")
        name, r = runs[0]
        fit = "" if r.baseline_fits else " (the baseline does not fit in memory)"
        return Outcome(ours_speedup=r.speedup,
                       detail=f"{BASELINES[name].summary} {r.baseline_s * 1e3:.0f} ms -> Centauri "
                              f"{r.centauri_s * 1e3:.0f} ms{fit}: {r.note}",
                       extra={"settings": [_row(name, r)]})
    fits = [(n, r) for n, r in runs if r.baseline_fits]
    if not fits:
        raise ConfigError(f"{case.id}: no setting's baseline fits in memory")
    name, best = max(fits, key=lambda nr: nr[1].speedup)
    spread = ", ".join(f"{r.label} {r.speedup:.2f}x" for _, r in sorted(fits, key=lambda nr: -nr[1].speedup)[1:4])
    left = len(runs) - len(fits)
    return Outcome(ours_speedup=best.speedup,
                   detail=f"largest of {len(fits)}: {best.label}, {BASELINES[name].summary} "
                          f"{best.baseline_s * 1e3:.0f} ms -> Centauri {best.centauri_s * 1e3:.0f} ms: {best.note}; "
                          f"next: {spread}"
                          + (f"; {left} left out (baseline out of memory)" if left else ""),
                   extra={"settings": [_row(n, r) for n, r in runs]})


def _row(name: str, r: Result) -> dict[str, Any]:
    return {"setting": r.label, "baseline": name, "baseline_ms": r.baseline_s * 1e3,
            "centauri_ms": r.centauri_s * 1e3, "speedup": r.speedup, "baseline_fits": r.baseline_fits}

