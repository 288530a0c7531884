"""The Python API (``import ccoverlap as cc``): the names, the results' repr / to_dict /
to_dataframe, the subpackage names staying functions, a fast torch-free import, and every
example of docs/api.md run in order as a notebook would."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ccoverlap as cc

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "fixtures" / "traces"


def test_the_api_names_are_there():
    for name in ("Workload", "analyze", "replay", "simulate", "plan", "search", "validate", "reproduce"):
        assert name in dir(cc) and callable(getattr(cc, name)), name
    from ccoverlap.predict.workload import Workload

    assert cc.Workload is Workload


def test_subpackage_imports_leave_the_functions_in_place():
    code = ("import ccoverlap as cc; import ccoverlap.replayer.run, ccoverlap.validation.reader, "
            "ccoverlap.reproduction.suite; from ccoverlap.replayer import whatif; "
            "from ccoverlap.validation.compare import compare_runs; "
            "print(all(type(f).__name__ == 'function' for f in (cc.replay, cc.validate, cc.reproduce)), "
            "whatif.__name__, 'torch' in __import__('sys').modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "ccoverlap.replayer.whatif", "False"]


def test_import_is_light_and_torch_free():
    code = ("import sys; import ccoverlap; heavy = ('torch', 'numpy', 'scipy', 'matplotlib', 'pandas', "
            "'ccoverlap.trace.analyze', 'ccoverlap.planning'); print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_quick_start_one_liner_works():
    code = ("import ccoverlap as cc; w = cc.Workload(model='llama-3-8b', cluster='dgx-h100', tp=2, dp=4); "
            f"print(cc.plan(w)); print(cc.analyze({str(TRACES / 'gloo_2rank')!r}).to_dataframe())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "as-given" in out.stdout and "step_time_s" in out.stdout and "[2 rows x" in out.stdout


def test_analysis_result_views_agree():
    a = cc.analyze(TRACES / "gloo_2rank")
    text = repr(a)
    assert text.startswith("<AnalysisResult: 2 rank(s), step ") and "\n" not in text
    d = a.to_dict()
    json.dumps(d)  # plain data
    df = a.to_dataframe()
    assert list(df["rank"]) == [r["rank"] for r in d["ranks"]]
    assert df["exposed_comm_s"].tolist() == pytest.approx([r["exposed_comm_s"] for r in d["ranks"]])
    assert len(a.to_dataframe("collectives")) == len(d["collectives"])
    with pytest.raises(cc.ConfigError, match="table must be one of"):
        a.to_dataframe("nope")


def test_plan_result_matches_the_cli(capsys, tmp_path):
    from ccoverlap.cli import main

    w = cc.Workload(model="llama-3-8b", cluster="dgx-h100", tp=2, dp=4)
    p = cc.plan(w)
    assert repr(p).startswith("<PlanReport: Llama-3-8B on 1x8 H100-SXM (TP2 x DP4")
    assert main(["plan", "--model", "llama-3-8b", "--cluster", "dgx-h100", "--tp", "2", "--dp", "4", "--json",
                 "--out", str(tmp_path)]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["best"] == p.best
    assert cli["recommendation"] == p.recommendation and cli["recommendation_details"] == p.recommendation_details
    assert p.to_dict()["best_step_time_s"] == pytest.approx(cli["best_step_time_s"], rel=1e-9)
    ours = {s["name"]: s["step_time_s"] for s in p.to_dict()["strategies"]}
    assert ours == pytest.approx({s["name"]: s["step_time_s"] for s in cli["strategies"]}, rel=1e-9)
    df = p.to_dataframe()
    assert df.loc[df["name"] == "as-given", "speedup"].item() == 1.0


def test_workload_arguments_and_errors():
    assert cc.Workload(model="llama-3-8b", cluster="dgx-h100", tp=2, dp=4).parallel.dp == 4
    w = cc.Workload(cluster="dgx-h100", nodes=2, tp=8, global_batch=32, dtype="fp8")
    assert (w.cluster.world_size, w.parallel.dp, w.parallel.fp8, w.batch.global_batch) == (16, 2, True, 32)
    assert cc.Workload.from_file(ROOT / "examples" / "llama3-8b-fsdp-a40.yaml", nodes=2).cluster.nodes == 2
    with pytest.raises(cc.ConfigError, match="nodes must be an integer, got True"):
        cc.Workload(nodes=True)
    with pytest.raises(cc.ConfigError, match="unknown workload option 'modle' \\(did you mean 'model'\\?\\)"):
        cc.Workload.from_file(ROOT / "examples" / "llama3-8b-fsdp-a40.yaml", modle="x")
    with pytest.raises(cc.ConfigError, match="either a Workload or workload options"):
        cc.simulate(w, tp=2)


def test_to_dataframe_without_pandas_says_what_to_install(monkeypatch):
    a = cc.analyze(TRACES / "gloo_2rank")
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(cc.ConfigError, match=r"pip install 'ccoverlap\[pandas\]'"):
        a.to_dataframe()


def _cells(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_docs_api_examples_run_in_order(monkeypatch):
    """Each ```python block of docs/api.md runs in one namespace, from the repository root; a
    block ending in an expression is evaluated like a notebook cell."""
    monkeypatch.chdir(ROOT)
    cells = _cells((ROOT / "docs" / "api.md").read_text())
    assert len(cells) >= 10
    ns: dict = {}
    for cell in cells:
        tree = ast.parse(cell)
        last = tree.body[-1]
        if isinstance(last, ast.Expr):
            exec(compile(ast.Module(tree.body[:-1], []), "<docs/api.md>", "exec"), ns)
            eval(compile(ast.Expression(last.value), "<docs/api.md>", "eval"), ns)
        else:
            exec(compile(tree, "<docs/api.md>", "exec"), ns)
    assert ns["p"].best in {s["name"] for s in ns["p"].to_dict()["strategies"]}
    assert ns["layouts"].to_dataframe()["label"].str.startswith("TP2").all()
