"""Lagom's experiments as ccoverlap comparisons (``ccoverlap/data/reproduce/lagom.yaml``).

``evaluate(case)`` reads ``case.spec["kind"]``:

* ``step``: a training step (``workload``: a workload mapping, the config-file schema of
  :mod:`ccoverlap.predict.workload`) simulated with NCCL's defaults, with Lagom and with
  AutoCCL-style tuning, each a per-communication plan (:func:`ccoverlap.deciders.lagom.step.tune_step`),
  all three from the same framework knobs; ``compare`` picks the ratio reported
  (``lagom/nccl``, ``autoccl/nccl`` or ``lagom/autoccl``: step time of the second over the
  first).
* ``range``: the smallest or largest (``pick``) of one comparison over the ``step`` cases
  named in ``settings``: how the paper states most of its results (Fig. 7: "1.10-1.33x
  across clusters and models").
* ``group``: one overlap group of a workload's step (``pattern``: ``compute-bound`` = the
  heaviest group with one all-gather beside computations; ``multi-comm`` = the heaviest
  group with a reduce-scatter), run with NCCL's defaults and with the configurations of
  ``configs`` applied to the collectives of the types they name; the ratio of makespans.
  The detail also gives what Lagom's own search (:func:`~ccoverlap.deciders.lagom.tune.lagom_tune`)
  chooses for the whole group, for comparison.
* ``contention``: a GEMM beside a collective (lagom §3.2, Fig. 3): the GEMM's time with the
  collective at ``baseline`` channels over its time at ``method`` channels.

Step results are cached per process, so the ``range`` cases reuse the ``step`` cases'
simulations when they run in the same process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from typing import TYPE_CHECKING, Any

from ccoverlap.errors import ConfigError
from ccoverlap.reproduction.suite import Case, Outcome

if TYPE_CHECKING:
    from ccoverlap.nccl.groups import OverlapGroup
    from ccoverlap.specs import CommConfig

KINDS = ("step", "range", "group", "contention")
COMPARES = ("lagom/nccl", "autoccl/nccl", "lagom/autoccl")


def evaluate(case: Case) -> Outcome:
    """ccoverlap's speedup for one Lagom case (see the module docstring)."""
    spec = case.spec
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"lagom case {case.id}: spec.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return {"step": _step_case, "range": _range_case, "group": _group_case,
            "contention": _contention_case}[kind](case)


# ----------------------------------------------------------------------------- steps

def _compare(case: Case) -> str:
    c = case.spec.get("compare", "lagom/nccl")
    if c not in COMPARES:
        raise ConfigError(f"lagom case {case.id}: compare must be one of {', '.join(COMPARES)}, got {c!r}")
    return c


@cache
def step_times(workload_json: str) -> dict[str, Any]:
    """Step times (seconds) of a workload with NCCL's defaults, Lagom and AutoCCL-style
    tuning, all from the workload's framework knobs, and the plans chosen (cached)."""
    from ccoverlap.deciders.lagom.step import tune_step
    from ccoverlap.predict.strategy import Planner
    from ccoverlap.predict.workload import workload_from_mapping

    w = workload_from_mapping(json.loads(workload_json), source="lagom case")
    planner = Planner(w, jobs=1)
    out: dict[str, Any] = {"nccl": planner.evaluate(w, "nccl").step_time_s, "describe": w.describe()}
    for method in ("lagom", "autoccl"):
        t = tune_step(planner, w, method)
        if t is None:
            raise ConfigError(f"{w.describe()}: no communication to tune")
        out[method] = t.result.step_time_s
        out[method + "_plan"] = t.plan.describe(limit=2)
    return out


def _setting(case: Case) -> dict[str, Any]:
    wl = case.spec.get("workload")
    if not isinstance(wl, dict):
        raise ConfigError(f"lagom case {case.id}: a step case needs a 'workload' mapping")
    return step_times(json.dumps(wl, sort_keys=True))


def _ratio(times: dict[str, Any], compare: str) -> float:
    method, base = compare.split("/")
    return times[base] / times[method]


def _step_case(case: Case) -> Outcome:
    c = _compare(case)
    t = _setting(case)
    detail = (f"step {t['nccl'] * 1e3:.0f} ms NCCL defaults, {t['lagom'] * 1e3:.0f} ms Lagom "
              f"({t['nccl'] / t['lagom']:.3f}x), {t['autoccl'] * 1e3:.0f} ms AutoCCL "
              f"({t['nccl'] / t['autoccl']:.3f}x); Lagom/AutoCCL {t['autoccl'] / t['lagom']:.3f}x; "
              f"Lagom: {t['lagom_plan']}")
    return Outcome(ours_speedup=_ratio(t, c), detail=detail,
                   extra={k: v for k, v in t.items() if isinstance(v, float)})


def _range_case(case: Case) -> Outcome:
    from ccoverlap.reproduction.suite import load_cases

    ids = case.spec.get("settings")
    pick = case.spec.get("pick")
    if not isinstance(ids, list) or not ids or pick not in ("min", "max"):
        raise ConfigError(f"lagom case {case.id}: a range case needs 'settings' (case ids) and pick: min|max")
    cases = {c.id: c for c in load_cases(["lagom"])[0]}
    missing = [i for i in ids if i not in cases or cases[i].spec.get("kind") != "step"]
    if missing:
        raise ConfigError(f"lagom case {case.id}: settings {missing} are not step cases of lagom.yaml")
    c = _compare(case)
    got = {i: _ratio(_setting(cases[i]), c) for i in ids}
    chosen = (min if pick == "min" else max)(got, key=lambda i: got[i])
    spread = ", ".join(f"{i} {v:.3f}" for i, v in got.items())
    return Outcome(ours_speedup=got[chosen], detail=f"{pick} over {len(ids)} settings at {chosen}: {spread}")


# ----------------------------------------------------------------------------- one overlap group

def _pick_group(groups: Sequence[OverlapGroup], pattern: object) -> OverlapGroup:
    """The heaviest overlap group of ``pattern`` (``compute-bound`` or ``multi-comm``, as the case spec gives it)."""
    if pattern == "compute-bound":
        fit = [g for g in groups if len(g.collectives) == 1 and g.collectives[0].spec.collective == "all_gather"]
    elif pattern == "multi-comm":
        fit = [g for g in groups if any(c.spec.collective == "reduce_scatter" for c in g.collectives)]
    else:
        raise ConfigError(f"pattern must be 'compute-bound' or 'multi-comm', got {pattern!r}")
    if not fit:
        raise ConfigError(f"no {pattern} overlap group in the simulated step")
    return max(fit, key=lambda g: g.weight * g.meta.get("window_s", 0.0))


def _group_case(case: Case) -> Outcome:
    from ccoverlap.deciders.lagom.profiler import SimulatedProfiler
    from ccoverlap.deciders.lagom.space import nccl_default_configs
    from ccoverlap.deciders.lagom.tune import lagom_tune
    from ccoverlap.nccl.groups import overlap_groups_from_step
    from ccoverlap.predict.strategy import Planner
    from ccoverlap.predict.workload import workload_from_mapping

    spec = case.spec
    w = workload_from_mapping(spec.get("workload") or {}, source=f"lagom case {case.id}")
    planner = Planner(w, jobs=1)
    step, tl = planner.simulate(w)
    g = _pick_group(overlap_groups_from_step(step.graph, tl, w.cluster, top=6), spec.get("pattern"))
    prof = SimulatedProfiler(g, planner.cost)
    base_cfgs = nccl_default_configs(g)
    cfgs = list(base_cfgs)
    for j, coll in enumerate(g.collectives):
        over = (spec.get("configs") or {}).get(coll.spec.collective)
        if over is not None:
            cfgs[j] = replace(cfgs[j], channels=int(over["nc"]), chunk_bytes=_bytes(over["chunk"]))
    base, new = prof.profile(base_cfgs), prof.profile(cfgs)
    own = lagom_tune(g, prof)
    chosen = ", ".join(f"{c.spec.collective} NC={k.channels} C={_chunk_kib(k)} KiB"
                       for c, k in zip(g.collectives, own.configs))
    detail = (f"{g.describe()}; Z {base.makespan_s * 1e3:.2f} -> {new.makespan_s * 1e3:.2f} ms, "
              f"Y {base.compute_time_s * 1e3:.2f} -> {new.compute_time_s * 1e3:.2f} ms, "
              f"X {base.comm_time_s * 1e3:.2f} -> {new.comm_time_s * 1e3:.2f} ms; Lagom's own choice "
              f"({chosen}): {base.makespan_s / own.result.makespan_s:.2f}x")
    return Outcome(ours_speedup=base.makespan_s / new.makespan_s, detail=detail)


def _chunk_kib(config: CommConfig) -> int:
    """The chunk size (KiB) of a configuration Lagom chose (its choices set every knob)."""
    assert config.chunk_bytes is not None, config
    return config.chunk_bytes // 1024


def _bytes(v: object) -> int:
    from ccoverlap.nccl.groups import parse_bytes

    return int(parse_bytes(v, "chunk"))


# ----------------------------------------------------------------------------- contention microbenchmark

def _contention_case(case: Case) -> Outcome:
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.cost import CostModel
    from ccoverlap.specs import CollectiveSpec, CommConfig, GemmSpec, GroupSpec

    s = case.spec
    try:
        cluster = get_cluster(s["cluster"])
        gemm = GemmSpec(**s["gemm"])
        group = GroupSpec(name="g", size=int(s["group_size"]), local_size=int(s["group_size"]))
        nbytes = float(_bytes(s["bytes"]))
        nc_method, nc_base = int(s["method_channels"]), int(s["baseline_channels"])
        threads = int(s.get("threads", 512))
        chunk = _bytes(s["chunk"]) if "chunk" in s else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"lagom case {case.id}: contention spec: {exc}") from None
    cm = CostModel(cluster)

    def coll(nc: int) -> CollectiveSpec:
        return CollectiveSpec(collective=s.get("collective", "all_reduce"), bytes=nbytes, group=group,
                              config=CommConfig(channels=nc, threads=threads, chunk_bytes=chunk))

    y_m, y_b = cm.duration_s(gemm, (coll(nc_method),)), cm.duration_s(gemm, (coll(nc_base),))
    x_m, x_b = cm.duration_s(coll(nc_method), (gemm,)), cm.duration_s(coll(nc_base), (gemm,))
    detail = (f"GEMM {gemm.m}x{gemm.n}x{gemm.k} beside the collective: {y_m * 1e3:.2f} ms at NC={nc_method}, "
              f"{y_b * 1e3:.2f} ms at NC={nc_base} (alone {cm.duration_s(gemm) * 1e3:.2f}); collective "
              f"{x_m * 1e3:.2f} vs {x_b * 1e3:.2f} ms")
    return Outcome(ours_speedup=y_b / y_m, detail=detail)
