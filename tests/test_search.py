"""`ccoverlap plan --search`: legal layouts only, memory filter, ranking, JSON, picture, bad input."""

import json

import pytest

from ccoverlap.cli import main
from ccoverlap.hardware import get_cluster
from ccoverlap.models import get_model
from ccoverlap.parallel.config import BatchConfig, config_problems
from ccoverlap.search import enumerate_layouts

ARGS = ["plan", "--search", "--model", "phi-2", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "16",
        "--seq-len", "2048", "--max-simulations", "4", "--top", "1"]


def test_enumerated_layouts_are_legal_and_cover_the_axes():
    model, cluster = get_model("llama-3-8b"), get_cluster("dgx-h100", nodes=2)
    batch = BatchConfig(global_batch=32, micro_batch=1, seq_len=4096)
    layouts = enumerate_layouts(model, cluster, batch)
    assert layouts
    for p, b in layouts:
        assert p.world_size == 16 and not config_problems(p, model, cluster, b)
        assert p.sequence_parallel == (p.tp > 1)
    seen = lambda f: {f(p, b) for p, b in layouts}  # noqa: E731
    assert seen(lambda p, b: p.tp) == {1, 2, 4, 8}
    assert {1, 2, 4, 8} <= seen(lambda p, b: p.pp)
    assert seen(lambda p, b: p.data_parallel) == {"ddp", "fsdp"}
    assert seen(lambda p, b: p.recompute) == {"none", "selective", "full"}
    assert seen(lambda p, b: p.pp_schedule) == {"1f1b", "interleaved"}
    assert seen(lambda p, b: b.micro_batch) == {1, 2, 4}
    assert seen(lambda p, b: getattr(p, "cp", 1)) == ({1, 2, 4, 8} if hasattr(layouts[0][0], "cp") else {1})
    assert len({(p, b) for p, b in layouts}) == len(layouts)


def test_search_json_ranks_fitting_layouts(capsys, tmp_path):
    code = main(ARGS + ["--json", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert doc["enumerated"] >= doc["fitting"] >= doc["simulated"] >= 1
    assert doc["simulated"] <= 4
    ranked = doc["ranked"]
    times = [r["best_knobs_step_time_s"] or r["step_time_s"] for r in ranked]
    assert times == sorted(times) and all(t > 0 for t in times)
    assert all(r["fits"] for r in ranked)
    assert ranked[0]["best_knobs"] is not None  # the top layout got the knob search
    assert (tmp_path / "search.png").stat().st_size > 10_000


def test_search_table_and_bad_input(capsys, tmp_path):
    assert main(ARGS + ["--no-png", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "layout search" in out and "legal layouts" in out and "TP" in out
    assert main(ARGS + ["--max-simulations", "0", "--out", str(tmp_path)]) == 2
    assert "--max-simulations" in capsys.readouterr().err
    code = main(["plan", "--search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "1",
                 "--global-batch", "16", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "mixture of experts" in err and "Traceback" not in err
