"""The Python API: ``import ccoverlap as cc``.

``cc.Workload`` describes a training job (keywords as the command line's flags, or
``Workload.from_file``); ``cc.analyze`` / ``cc.replay`` read torch.profiler traces;
``cc.simulate`` / ``cc.plan`` / ``cc.search`` predict; ``cc.validate`` and ``cc.reproduce``
compare predictions with measurements and with the papers. Each returns one of the result
classes at the end of this module: one short line as ``repr``, a small table as ``str``, every
number as plain data (``to_dict()``) and the main table as a pandas DataFrame
(``to_dataframe()``, with the ``pandas`` extra: ``pip install 'ccoverlap[pandas]'``); each keeps
the object the library computed as ``raw`` (an :class:`~ccoverlap.trace.result.Analysis`, a
:class:`~ccoverlap.planning.strategies.PlanResult`, ...) for everything the summary leaves out.
Times are seconds everywhere. Errors are :class:`~ccoverlap.errors.CCOverlapError` with one
clear line.

Everything is imported when first used, so ``import ccoverlap`` stays fast and never imports
torch. docs/api.md walks through it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ccoverlap.errors import ConfigError

if TYPE_CHECKING:  # imported when first used at run time (the catalog is not needed to analyse traces)
    import pandas as pd  # type: ignore[import-untyped]  # an optional extra without type information

    from ccoverlap.predict.workload import Workload
    from ccoverlap.replayer.run import ReplayResult
    from ccoverlap.trace.result import Analysis

Paths: TypeAlias = "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]"
#: What the predicting functions take as ``workload``: a Workload, a config file, or None (keywords).
WorkloadArg: TypeAlias = "Workload | str | os.PathLike[str] | None"


def _paths(traces: object) -> list[str]:
    """``traces`` (a path or a list of paths) as a list of paths; TraceError otherwise."""
    from ccoverlap.config import short
    from ccoverlap.errors import TraceError

    items = [traces] if isinstance(traces, (str, os.PathLike)) else traces
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, (str, os.PathLike)) for t in items):
        raise TraceError(f"traces: expected a path or a list of paths (files or directories), got {short(traces)}")
    return [os.fspath(t) for t in items]


def _names(value: object, what: str) -> list[str] | None:
    """``value`` (None, a name or a list of names) as None or a list of names; ConfigError otherwise."""
    from ccoverlap.config import short
    from ccoverlap.errors import ConfigError

    if value is None or isinstance(value, str):
        return None if value is None else [value]
    items = list(value) if isinstance(value, (list, tuple, set, frozenset)) else None
    if items is None or not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{what}: expected a name or a list of names, got {short(value)}")
    return items


def _workload(workload: object, options: dict[str, Any]) -> Workload:
    """A Workload from a Workload (options must be empty), a config file path, or keywords."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.predict.workload import Workload, check_options

    if workload is None:
        return Workload(**check_options(options))
    if isinstance(workload, Workload):
        if options:
            raise ConfigError(f"give either a Workload or workload options, not both (got {sorted(options)})")
        return workload
    if isinstance(workload, (str, os.PathLike)):
        return Workload.from_file(workload, **options)  # names the unknown options itself
    raise ConfigError(f"workload: expected a Workload, a config file or None, got {type(workload).__name__}")


def analyze(traces: Paths, *, steps: str = "hta", time_resolution: str = "hta", jobs: int | None = None,
            groups: dict[str, str] | None = None) -> AnalysisResult:
    """Measure overlap in torch.profiler traces (files or directories, one file per rank):
    per rank and step compute, communication, overlap, exposed communication and idle time
    (HolisticTraceAnalysis' definitions), per-collective bandwidths, stragglers, contention
    and a verdict. ``steps``: ``"hta"`` (HTA's window), ``"all"`` or ``"3-5"``."""
    from ccoverlap.trace.analyze import analyze as _analyze
    from ccoverlap.trace.dimensions import check_group_keys, check_groups

    if groups is not None:
        groups = check_groups(groups, "groups")
    a = _analyze(_paths(traces), steps=steps, time_resolution=time_resolution, jobs=jobs, groups=groups)
    if groups:  # a key that matches no process group is an error, not ignored
        check_group_keys(groups, a.ranks, {g for d in a.dimensions for g in d.groups}, where="groups")
    return AnalysisResult.of(a)


def replay(traces: Paths, *, steps: str = "hta", whatifs: Sequence[str] | None = None,
           cluster: str | None = None) -> ReplayReport:
    """Rebuild the measured step of ``traces`` (one file per rank, with GPU events), replay it
    and run what-ifs (``no-comm``, ``comm-hidden``, ``lagom``, ``network-2x``, ...; default
    all): step time, exposed communication and gain of each, and a recommendation."""
    from ccoverlap.replayer.run import replay as _replay

    return ReplayReport.of(_replay(_paths(traces), steps=steps, whatifs=_names(whatifs, "whatifs"), cluster=cluster))


def simulate(workload: WorkloadArg = None, **options: Any) -> SimulationResult:
    """Simulate one training step of ``workload`` (a :class:`Workload`, a config file, or
    keywords as for ``Workload``): step time and, per simulated rank, compute, communication,
    overlap, exposed communication and idle time (seconds). ``raw`` is (StepGraph, Timeline)."""
    from ccoverlap.predict.evaluate import simulate_workload
    from ccoverlap.sim.timeline import all_rank_metrics, step_time_s

    w = _workload(workload, options)
    step, tl = simulate_workload(w)
    ranks = [m.to_dict() for m in all_rank_metrics(tl)]
    data = {"workload": w.describe(), "step_time_s": step_time_s(tl), "ops": len(step.graph), "ranks": ranks}
    summary = f"{w.describe()}: step {_ms(data['step_time_s'])}, {len(step.graph)} ops"
    return SimulationResult(data, ranks, summary, (step, tl))


def plan(workload: WorkloadArg = None, *, strategies: Sequence[str] | None = None, exact: bool = False,
         strategy: str | None = None, target: str = "pytorch", **options: Any) -> PlanReport:
    """Predict the step time of ``workload`` as given, without overlap, with the best overlap
    knobs and under each decider (Lagom, Centauri, FiCCO; ``strategies`` picks them by name),
    and recommend one. ``exact``: judge every candidate on the full step (slower). The last
    row, ``applicable``, is ``strategy`` (default: the recommended one) re-simulated with only
    what ``target`` (``pytorch``, ``torchtitan``, ``megatron-lm``) and stock NCCL can set;
    ``emit(dir)`` / ``apply_hints()`` on the result give its settings (docs/emit.md)."""
    from ccoverlap.config import check_value
    from ccoverlap.planning.strategies import default_registry, recommendation, recommendation_details
    from ccoverlap.planning.strategies import plan as plan_workload

    check_value("exact", exact, bool)
    w = _workload(workload, options)
    strategies = _names(strategies, "strategies")
    registry = default_registry()
    if strategies is not None:
        registry.select(list(strategies))  # one ConfigError naming an unknown one
    result = plan_workload(w, extra=strategies, registry=registry, exact=exact, applicable_of=strategy,
                           target=target)
    base = result.as_given.step_time_s
    rows = [dict(d, speedup=base / d["step_time_s"] if d["step_time_s"] else None) for d in result.rows()]
    best = result.best()
    row = result.best_row()
    data = {"workload": w.describe(), "world_size": w.cluster.world_size, "best": best.name,
            "best_row": row.name, "best_step_time_s": row.step_time_s,
            "recommendation": recommendation(result),
            "recommendation_details": recommendation_details(result), "strategies": rows,
            "simulations": result.simulations, "seconds": result.seconds}
    summary = f"{w.describe()}: best {best.name}, {_ms(row.step_time_s)} per step ({base / row.step_time_s:.2f}x)"
    return PlanReport(data, rows, summary, result)


def search(workload: WorkloadArg = None, *, max_simulations: int = 24, top: int = 3,
           constraints: dict[str, Any] | None = None,
           **options: Any) -> SearchReport:
    """Search the layouts (TP / CP / PP / DP, FSDP / DDP / HSDP, EP, micro-batch, recompute,
    pipeline schedule) of ``workload``'s model on its cluster at its global batch, ranked by
    predicted step time. ``constraints`` keeps layouts with given values (``{"tp": 8}``)."""
    from ccoverlap.planning.search import search as _search

    w = _workload(workload, options)
    result = _search(w, max_simulations=max_simulations, top=top, constraints=constraints)
    data = result.to_dict()
    rows = data.get("ranked") or []
    head = f"best {rows[0]['label']}, {_ms(rows[0].get('best_knobs_step_time_s') or rows[0].get('step_time_s'))}" \
        if rows else "no layout fits"
    return SearchReport(data, rows, f"{data.get('workload', w.describe())}: {len(rows)} layouts ranked; {head}", result)


def validate(runs: str | os.PathLike[str] = "published", *, only: Sequence[str] | None = None,
             subset: str | None = None, jobs: int = 1) -> ValidationReport:
    """Predicted vs measured step time of the runs in a runs file (``"published"``: the set
    shipped with ccoverlap): per run the error; runs that cannot be read or predicted are
    listed in ``invalid_runs`` instead of stopping the others. ``only``: run names."""
    from ccoverlap.errors import ConfigError
    from ccoverlap.validation.compare import compare_runs, summarize
    from ccoverlap.validation.reader import SUBSETS, load_runs

    only = _names(only, "only")
    if subset is not None and subset not in SUBSETS:
        raise ConfigError(f"subset must be one of {list(SUBSETS)}, got {subset!r}")
    rf = load_runs(Path(runs) if isinstance(runs, os.PathLike) else runs, keep_going=True)
    names = [r.name for r in rf.runs]
    for name in only or ():
        if name not in names:
            from ccoverlap.config import short, suggest

            raise ConfigError(f"{rf.path}: no run named {short(name)}{suggest(name, names)}")
    chosen = [r for r in rf.runs if (not only or r.name in only) and (subset is None or r.subset == subset)]
    if not chosen:
        raise ConfigError(f"{rf.path}: no run to predict" + (f" ({rf.problems[0]})" if rf.problems else ""))
    rows = compare_runs(chosen, jobs=jobs)
    summ = summarize(rows)
    dicts = [r.to_dict() for r in rows]
    invalid = rf.problems + [f"{r.run.name}: {r.problem}" for r in rows if not r.ok]
    data = {"runs_file": rf.path, "summary": summ.to_dict(), "runs": dicts, "invalid_runs": invalid}
    return ValidationReport(data, [d for d in dicts if d.get("predicted_step_time_s") is not None],
                            f"{rf.path}: {summ.line('runs')}", rows)


def reproduce(papers: Sequence[str] | None = None, *, cases: Sequence[str] | None = None,
              jobs: int = 1) -> ReproductionReport:
    """Run the papers' headline experiments (``lagom``, ``centauri``, ``ficco``; default all)
    as ccoverlap comparisons: per case the paper's speedup, ours, and match or miss."""
    from ccoverlap.reproduction.suite import run_suite

    result = run_suite(_names(papers, "papers") or None, ids=_names(cases, "cases") or None, jobs=jobs)
    data = result.to_dict()
    s = data["summary"]["all"]
    return ReproductionReport(data, data["rows"], f"{s['matches']} of {s['expressible']} expressible cases match "
                                                  f"({s['cases']} cases)", result)


# ----------------------------------------------------------------------------- results

def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    return str(v)


def format_rows(rows: list[dict[str, Any]], columns: list[str], *, limit: int = 20) -> str:
    """A plain-text table of ``columns`` of ``rows`` (the first ``limit`` rows), never cut."""
    shown = rows[:limit]
    cells = [columns] + [[_fmt(r.get(c)) for c in columns] for r in shown]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows (to_dataframe() has them all)")
    return "\n".join(lines)


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    """The scalar fields of ``row`` (nested lists and mappings left out of a table row)."""
    return {k: v for k, v in row.items() if not isinstance(v, (list, dict, tuple))}


class Result:
    """Base of the API's results: ``data`` (plain data, what ``to_dict`` returns), ``rows``
    (the main table, one mapping per row), a one-line ``summary`` and the ``raw`` object."""

    #: columns of the text table (``str``); every scalar column goes into the DataFrame
    columns: tuple[str, ...] = ()

    def __init__(self, data: dict[str, Any], rows: list[dict[str, Any]], summary: str, raw: Any = None) -> None:
        self._data = data
        self._rows = [_flat(r) for r in rows]
        self.summary = summary
        self.raw = raw

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain data (JSON-ready: numbers, strings, lists, mappings)."""
        return self._data

    def to_dataframe(self) -> pd.DataFrame:
        """The main table as a ``pandas.DataFrame`` (needs the ``pandas`` extra)."""
        try:
            import pandas as pd
        except ImportError:
            raise ConfigError("to_dataframe() needs pandas: pip install 'ccoverlap[pandas]'") from None
        return pd.DataFrame(self._rows)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The main table, one mapping of scalar values per row."""
        return list(self._rows)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.summary}>"

    def __str__(self) -> str:
        cols = [c for c in self.columns if any(c in r for r in self._rows)]
        return self.summary + ("\n" + format_rows(self._rows, cols) if cols and self._rows else "")


def _ms(x: Any) -> str:
    """Seconds as milliseconds with one decimal; ``-`` for anything not a finite number."""
    return f"{x * 1e3:.1f} ms" if isinstance(x, (int, float)) and math.isfinite(x) else "-"


class AnalysisResult(Result):
    """Measured overlap of profiler traces: one row per rank (:func:`ccoverlap.analyze`);
    ``to_dataframe(table)`` also gives ``per_step``, ``collectives``, ``dimensions`` or
    ``comm_kernels``."""

    columns = ("rank", "step_time_s", "compute_s", "comm_s", "overlap_ratio", "exposed_comm_s", "idle_s")

    @classmethod
    def of(cls, analysis: Analysis) -> AnalysisResult:
        """The result of a :class:`~ccoverlap.trace.analyze.Analysis`."""
        d = analysis.to_dict()
        s = d.get("summary") or {}
        summary = (f"{s.get('ranks', 0)} rank(s), step {_ms(s.get('step_time_s'))}, exposed communication "
                   f"{_ms(s.get('exposed_comm_s'))}, overlap {s.get('overlap_ratio', float('nan')):.1%}; "
                   f"{(d.get('verdict') or {}).get('label', '')}").rstrip("; ")
        return cls(d, d.get("ranks") or [], summary, analysis)

    def to_dataframe(self, table: str = "ranks") -> pd.DataFrame:
        """One of the analysis' tables as a DataFrame: ``ranks`` (default), ``per_step``,
        ``collectives``, ``dimensions`` or ``comm_kernels``."""
        if table == "ranks":
            return super().to_dataframe()
        tables = ("per_step", "collectives", "dimensions", "comm_kernels")
        if table not in tables:
            raise ConfigError(f"table must be one of {('ranks', *tables)}, got {table!r}")
        return Result({}, self._data.get(table) or [], "").to_dataframe()


class ReplayReport(Result):
    """A measured step replayed and its what-ifs: one row per scenario (:func:`ccoverlap.replay`)."""

    columns = ("name", "step_time_s", "exposed_comm_s", "overlap_ratio", "gain_pct")

    @classmethod
    def of(cls, res: ReplayResult) -> ReplayReport:
        """The report of a :class:`~ccoverlap.replayer.run.ReplayResult`."""
        from ccoverlap.replayer.report import to_dict  # lazy: `ccoverlap --help` imports this module

        d = to_dict(res, {})
        rows = [d["measured"], d["replay"], *d.get("whatifs", [])]
        return cls(d, rows, f"{len(d.get('whatifs', []))} what-if(s); {d.get('recommendation', '')}", res)


class SimulationResult(Result):
    """One simulated step: one row per simulated rank (:func:`ccoverlap.simulate`)."""

    columns = ("rank", "compute_s", "comm_s", "overlap_ratio", "exposed_comm_s", "idle_s")


class PlanReport(Result):
    """Predicted step time under each overlap strategy, best first is ``best``
    (:func:`ccoverlap.plan`)."""

    columns = ("name", "step_time_s", "speedup", "exposed_comm_s", "overlap_ratio", "mfu", "fits_memory")

    @property
    def best(self) -> str:
        """The name of the recommended strategy: the one whose step a user can run (with what
        the target and stock NCCL can set of it) is fastest among those that fit in memory."""
        return self._data["best"]

    @property
    def recommendation(self) -> str:
        """One short line: what to use and the step it predicts."""
        return self._data["recommendation"]

    @property
    def recommendation_details(self) -> list[str]:
        """The sentences behind :attr:`recommendation`, one each."""
        return list(self._data.get("recommendation_details", []))

    def emit(self, out_dir: str | os.PathLike[str], strategy: str | None = None, target: str = "pytorch"
             ) -> dict[str, str]:
        """Write ``strategy``'s settings (default: the one the ``applicable`` row is for) into
        ``out_dir``: nccl.env, the NCCL tuner plugin's CSV, per-group NCCL options, framework
        settings, the TP plan, decision.json and README.md (docs/emit.md); ``{file: path}``."""
        return self.raw.emit(out_dir, strategy=strategy, target=target)

    def apply_hints(self, strategy: str | None = None, target: str = "pytorch") -> dict[str, Any]:
        """What :meth:`emit` writes, as plain data (``nccl_env``, ``tuner_rows``,
        ``process_groups``, ``fully_shard``, ``ddp``, ``torchtitan``, ``megatron_args``,
        ``tp_plan``, ``not_applied``, ...)."""
        return self.raw.apply_hints(strategy=strategy, target=target)


class SearchReport(Result):
    """Layouts ranked by predicted step time (:func:`ccoverlap.search`)."""

    columns = ("label", "step_time_s", "best_knobs_step_time_s", "mfu", "exposed_comm_s", "fits")


class ValidationReport(Result):
    """Predicted vs measured step time of training runs: one row per predicted run, and the
    runs that could not be read or predicted in ``invalid_runs`` (:func:`ccoverlap.validate`)."""

    columns = ("name", "gpu", "gpus", "measured_step_time_s", "predicted_step_time_s", "error_pct")

    @property
    def invalid_runs(self) -> list[str]:
        """One line per run of the file that was not read (what is wrong with it)."""
        return list(self._data.get("invalid_runs", []))


class ReproductionReport(Result):
    """The papers' headline experiments, ours against theirs (:func:`ccoverlap.reproduce`)."""

    columns = ("paper", "id", "paper_speedup", "ours_speedup", "gain_ratio", "verdict")
