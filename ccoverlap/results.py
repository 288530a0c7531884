"""Results of the Python API (:mod:`ccoverlap.api`): one short line as ``repr``, a small table
as ``str``, every number as plain data (``to_dict()``) and the main table as a pandas
DataFrame (``to_dataframe()``, with the ``pandas`` extra: ``pip install 'ccoverlap[pandas]'``).

Each result keeps the object the library computed as ``raw`` (an
:class:`~ccoverlap.trace.analyze.Analysis`, a :class:`~ccoverlap.planning.strategies.PlanResult`,
...) for everything the summary leaves out. Times are seconds everywhere.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]  # an optional extra without type information

    from ccoverlap.replay.run import ReplayResult
    from ccoverlap.trace.result import Analysis


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
        """The report of a :class:`~ccoverlap.replay.run.ReplayResult`."""
        from ccoverlap.replay.report import to_dict  # lazy: `ccoverlap --help` imports this module

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
