"""The reproduction suite: each paper's headline experiments as ccoverlap comparisons.

A *case* is one comparison a paper reports: a setting (model, cluster, parallelism, the
framework knobs both sides share), the method and the baseline the paper names, and the
paper's speedup (method over baseline, quoted with its table / figure / section). ccoverlap
computes its own speedup for the same comparison; the *gain ratio* is
``(ours - 1) / (paper - 1)`` and a case *matches* when ``|ours - paper| <= 0.3 * |paper - 1|``
(the gain within 30%).

Cases are data: one file per paper, ``ccoverlap/data/reproduce/<paper>.yaml``, read into
:class:`Case` records (typed, checked). Each paper's evaluator is a module
``ccoverlap.reproduce.<paper>`` with ``evaluate(case) -> Outcome``; the suite names them in
:data:`PAPERS` (nothing registers itself on import) and imports one only when its cases run.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from ccoverlap.config import Count, check_value, few, short, suggest
from ccoverlap.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "reproduce"
# paper -> its evaluator module (``evaluate(case) -> Outcome``)
PAPERS: dict[str, str] = {
    "lagom": "ccoverlap.reproduction.lagom",
    "centauri": "ccoverlap.reproduction.centauri",
    "ficco": "ccoverlap.reproduction.ficco",
}
TOLERANCE = 0.30  # a case matches when the gain is within 30% of the paper's


class Case(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One comparison a paper reports.

    ``paper_speedup``: method time over baseline time inverted (throughput ratio, > 1 means
    the method is faster), as the paper states it; ``None`` when the paper gives no number.
    ``expressible``: False (with ``why_not``) for a comparison ccoverlap cannot model;
    it is listed, never counted. ``fit``: True for a case whose figure a model parameter was
    fitted on (the parameter's source names it); it is computed and shown with the verdict
    ``fit``, never counted, since it matches by construction. ``spec``: what the paper's
    evaluator needs (a workload config, a GEMM shape, ...), checked by that evaluator."""

    id: str
    setting: str
    source: str
    quote: str
    method: str
    baseline: str
    paper_speedup: float | None = None
    headline: bool = False
    expressible: bool = True
    why_not: str = ""
    fit: bool = False
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    paper: str = ""


class PaperFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    paper: Literal["lagom", "centauri", "ficco"]
    title: str
    reference: str
    cases: list[Case]


@dataclass(kw_only=True)
class Outcome:
    """ccoverlap's figure for one case: ``ours_speedup`` (method over baseline, > 1 faster),
    a one-line ``detail`` (what was compared: times, chosen configuration)."""

    ours_speedup: float | None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class Row:
    case: Case
    outcome: Outcome | None
    error: str = ""

    @property
    def expressible(self) -> bool:
        """Counted: the case is expressible, not a fit case, has the paper's figure and ran."""
        return (self.case.expressible and not self.case.fit and self.case.paper_speedup is not None
                and self.error == "")

    @property
    def gain_ratio(self) -> float | None:
        """``(ours - 1) / (paper - 1)``; None when either side is missing or the paper's gain is 0."""
        p, o = self.case.paper_speedup, self.outcome.ours_speedup if self.outcome else None
        if p is None or o is None or p == 1.0:
            return None
        return (o - 1.0) / (p - 1.0)

    @property
    def matches(self) -> bool | None:
        """Within :data:`TOLERANCE` of the paper's gain; None when not expressible."""
        if not self.expressible or self.outcome is None or self.outcome.ours_speedup is None:
            return None
        p, o = self.case.paper_speedup, self.outcome.ours_speedup
        assert p is not None  # expressible: the paper gives its figure
        return abs(o - p) <= TOLERANCE * abs(p - 1.0) + 1e-12

    @property
    def verdict(self) -> str:
        if self.error:
            return "error"
        if not self.case.expressible:
            return "not expressible"
        if self.case.fit:
            return "fit"
        m = self.matches
        return "n/a" if m is None else ("match" if m else "miss")

    def to_dict(self) -> dict[str, Any]:
        c = self.case
        return {"paper": c.paper, "id": c.id, "setting": c.setting, "source": c.source, "quote": c.quote,
                "method": c.method, "baseline": c.baseline, "paper_speedup": c.paper_speedup,
                "ours_speedup": self.outcome.ours_speedup if self.outcome else None,
                "gain_ratio": self.gain_ratio, "verdict": self.verdict, "headline": c.headline,
                "detail": (self.outcome.detail if self.outcome else "") or self.error or c.why_not}


@dataclass(kw_only=True)
class SuiteResult:
    rows: list[Row]
    titles: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Counts over all papers and per paper: cases, expressible, matches, headline matches."""
        def count(rows: list[Row]) -> dict[str, Any]:
            expr = [r for r in rows if r.expressible]
            return {"cases": len(rows), "expressible": len(expr), "fit": sum(1 for r in rows if r.case.fit),
                    "matches": sum(1 for r in expr if r.matches),
                    "share": (sum(1 for r in expr if r.matches) / len(expr)) if expr else None,
                    "headline_matches": sum(1 for r in expr if r.case.headline and r.matches),
                    "headline_cases": sum(1 for r in expr if r.case.headline)}
        per = {p: count([r for r in self.rows if r.case.paper == p]) for p in dict.fromkeys(r.case.paper for r in self.rows)}
        return {"all": count(self.rows), "papers": per}

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "papers": self.titles, "rows": [r.to_dict() for r in self.rows]}


def load_cases(papers: Iterable[str] | None = None, data_dir: Path = DATA_DIR) -> tuple[list[Case], dict[str, str]]:
    """The cases of ``papers`` (default: every paper with a file in ``data_dir``), each tagged
    with its paper, and ``{paper: title}``. A malformed file raises one ConfigError naming it."""
    wanted = list(papers) if papers else None
    if wanted:
        unknown = [p for p in wanted if p not in PAPERS]
        if unknown:
            raise ConfigError(f"unknown paper(s) {', '.join(unknown)}; known: {', '.join(PAPERS)}")
    cases: list[Case] = []
    titles: dict[str, str] = {}
    for paper in wanted or list(PAPERS):
        path = data_dir / f"{paper}.yaml"
        if not path.exists():
            if wanted:
                raise ConfigError(f"no cases for {paper}: {path.name} is missing")
            continue
        try:
            raw = yaml.safe_load(path.read_text())
            pf = msgspec.convert(raw, PaperFile)
        except (yaml.YAMLError, msgspec.ValidationError) as exc:
            raise ConfigError(f"{path.name}: {str(exc)[:300]}") from None
        if pf.paper != paper:
            raise ConfigError(f"{path.name}: says paper {pf.paper!r}, expected {paper!r}")
        ids = [c.id for c in pf.cases]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ConfigError(f"{path.name}: duplicate case id(s) {', '.join(dup)}")
        titles[paper] = f"{pf.title} ({pf.reference})"
        cases.extend(msgspec.structs.replace(c, paper=paper) for c in pf.cases)
    return cases, titles


Evaluator = Callable[[Case], Outcome]


def evaluator_for(paper: str, evaluators: Mapping[str, Evaluator] | None = None) -> Evaluator:
    """The ``evaluate`` function of ``paper`` (from ``evaluators`` if given, else its module in :data:`PAPERS`)."""
    if evaluators is not None and paper in evaluators:
        return evaluators[paper]
    return importlib.import_module(PAPERS[paper]).evaluate


def run_case(case: Case, evaluators: Mapping[str, Evaluator] | None = None) -> Row:
    """Evaluate one case; a ConfigError from its spec becomes the row's error (never raised)."""
    if not case.expressible:
        return Row(case=case, outcome=None)
    try:
        return Row(case=case, outcome=evaluator_for(case.paper, evaluators)(case))
    except ConfigError as exc:
        return Row(case=case, outcome=None, error=str(exc))


_POOL_CASES: list[Case] = []


def _run_index(i: int) -> Row:
    return run_case(_POOL_CASES[i])


def run_suite(papers: Iterable[str] | None = None, *, ids: Iterable[str] | None = None, jobs: int = 1,
              progress: Callable[[int, int, str], None] | None = None,
              evaluators: Mapping[str, Evaluator] | None = None, data_dir: Path = DATA_DIR) -> SuiteResult:
    """Load and evaluate the cases of ``papers`` (only ``ids`` if given), in ``jobs`` forked
    processes when more than one (same rows, same order)."""
    global _POOL_CASES
    check_value("jobs", jobs, Count)
    cases, titles = load_cases(papers, data_dir)
    if ids:
        wanted = set(ids)
        missing = wanted - {c.id for c in cases}
        if missing:
            one = sorted(missing)[0]
            known = sorted(c.id for c in cases)
            raise ConfigError(f"unknown case id(s): {few([short(m) for m in sorted(missing)], sep=', ')}{suggest(one, known)}; "
                              f"known: {few(known, n=5, sep=', ')}")
        cases = [c for c in cases if c.id in wanted]
    rows: list[Row] = []
    if jobs > 1 and evaluators is None and len(cases) > 1 and "fork" in mp.get_all_start_methods():
        _POOL_CASES = cases
        with mp.get_context("fork").Pool(min(jobs, len(cases))) as pool:
            for i, row in enumerate(pool.imap(_run_index, range(len(cases)))):
                rows.append(row)
                if progress:
                    progress(i + 1, len(cases), row.case.id)
        _POOL_CASES = []
    else:
        for i, case in enumerate(cases):
            rows.append(run_case(case, evaluators))
            if progress:
                progress(i + 1, len(cases), case.id)
    return SuiteResult(rows=rows, titles=titles)


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))
