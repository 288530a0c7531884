"""Collective sizes from the trace itself, per-kernel bandwidth, and overlap per parallelism dimension."""

from __future__ import annotations

import json

import pytest
from trace_synth import kernel, nccl, trace, write

from ccoverlap.cli import main
from ccoverlap.errors import ConfigError
from ccoverlap.trace.analyze import analyze
from ccoverlap.trace.dimensions import dimension_of, load_groups


def test_all_gather_size_and_group_from_the_enclosing_c10d_op(shared_traces):
    # sampled_rank-0 (world size 128): nccl:_all_gather_base has a 16 MiB input; the enclosing
    # c10d::_allgather_base_ has output [1073741824] and input [16777216] (signed char): 1 GiB
    # gathered over a group of 1 GiB / 16 MiB = 64 ranks. Its kernel lasts ~42.5 ms, so
    # algbw = 2^30 B / 42.5 ms = 25.3 GB/s (not 2 GiB / 42.5 ms = 50 GB/s with the world size of 128).
    a = analyze([shared_traces / "trace_filter" / "sampled_rank-0.json.gz"], steps="hta")
    ag = [c for c in a.collectives if c.collective == "all_gather"]
    assert len(ag) == 1
    ag = ag[0]
    assert ag.group_size == 64
    assert ag.bytes_mean == 2**30
    assert ag.algbw == pytest.approx(ag.count * 2**30 / ag.time_total_s)
    assert 24e9 < ag.algbw < 26.5e9
    assert ag.busbw == pytest.approx(ag.algbw * 63 / 64)
    # the per-kernel rows of --json say the same, kernel by kernel, and where the size came from
    rows = [r for r in a.to_dict()["comm_kernels"] if r["collective"] == "all_gather"]
    assert len(rows) == ag.count >= 1
    for r in rows:
        assert r["bytes"] == 2**30 and r["group_size"] == 64
        assert r["size_source"] == "c10d::_allgather_base_ tensors"
        assert r["algbw"] == pytest.approx(2**30 / r["dur_s"], rel=1e-9)
        assert 20e9 < r["algbw"] < 30e9


def test_record_param_comms_sizes_win_over_the_op_input(tmp_path):
    # a kernel whose own args give In/Out msg nelems: that size and the stated group size are used
    k = nccl("all_gather", 0, 1000, nelems=1 << 20, size=8)
    doc = trace([kernel("gemm", 0, 500), k], rank=0, world=16)
    a = analyze([write(doc, tmp_path / "r.json")])
    row = a.to_dict()["comm_kernels"][0]
    assert row["group_size"] == 8 and row["size_source"].startswith("collective record")


def _tpdp(fixtures_dir):
    return fixtures_dir / "gloo_tpdp_4rank"


def test_per_dimension_table_on_a_real_gloo_tp_dp_run(fixtures_dir):
    a = analyze([_tpdp(fixtures_dir)])
    dims = {d.dimension: d for d in a.dimensions}
    assert set(dims) == {"TP", "DP"}
    tp, dp = dims["TP"], dims["DP"]
    # the mesh's groups, as PyTorch described them, on all 4 ranks
    assert tp.ranks == dp.ranks == 4
    assert "mesh_tp" in tp.how and "mesh_dp" in dp.how
    assert tp.collectives == ["all_reduce"] and dp.collectives == ["all_gather", "all_reduce"]
    # every rank's gloo threads were matched to its own groups: TP all_reduces are the 256 KiB
    # ones, DP all_reduces the 1 MiB ones, DP all_gathers gather 2 x 256 KiB
    for rt in a.ranks:
        tl = rt.timeline          # the rank's analysed communication rows
        m = tl.kind == "comm"
        pg = rt.meta["pg_config"]
        for g, c, b in zip(tl.group[m], tl.collective[m], tl.bytes[m]):
            desc = pg[g]["desc"]
            assert rt.rank in pg[g]["ranks"]
            if c == "all_reduce":
                assert (desc, b) in (("mesh_tp", 256 * 1024), ("mesh_dp", 1 << 20)), (rt.rank, g, c, b)
            else:
                assert (desc, b) == ("mesh_dp", 512 * 1024), (rt.rank, g, c, b)
    # the TP all_reduce is synchronous (nothing runs beside it), the DP all_reduce is async
    assert tp.exposed_s == pytest.approx(tp.time_s) and tp.overlap_ratio < 0.02
    assert dp.overlap_s > 0
    for d in (tp, dp):
        assert d.time_s == pytest.approx(d.exposed_s + d.overlap_s)
        assert d.algbw and d.algbw > 0
        assert sum(r["time_s"] for r in d.per_rank.values()) == pytest.approx(d.time_s)


def test_per_dimension_table_in_cli_and_json(fixtures_dir, capsys):
    assert main(["analyze", str(_tpdp(fixtures_dir)), "--no-png", "-q"]) == 0
    out = capsys.readouterr().out
    assert "Per parallelism dimension" in out and "mesh_tp" in out and "mesh_dp" in out
    assert main(["analyze", str(_tpdp(fixtures_dir)), "--no-png", "-q", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {d["dimension"] for d in doc["dimensions"]} == {"TP", "DP"}


def test_groups_file_overrides_the_descriptions(fixtures_dir, tmp_path):
    f = tmp_path / "groups.json"
    f.write_text(json.dumps({"mesh_dp": "FSDP", "ranks:0,1": "TP-a"}))
    a = analyze([_tpdp(fixtures_dir)], groups=load_groups(f))
    names = {d.dimension for d in a.dimensions}
    assert "FSDP" in names and "TP-a" in names and "DP" not in names


@pytest.mark.parametrize("content,msg", [("not json", "not valid JSON"), ("[1]", "expected a JSON object"),
                                         ('{"a": 3}', "must be a non-empty string")])
def test_bad_groups_file(tmp_path, content, msg):
    f = tmp_path / "g.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=msg):
        load_groups(f)
    with pytest.raises(ConfigError, match="cannot read"):
        load_groups(tmp_path / "missing.json")


@pytest.mark.parametrize("desc,dim", [("mesh_tp", "TP"), ("mesh_dp_shard", "FSDP"), ("mesh_dp_replicate", "DP"),
                                      ("mesh_pp", "PP"), ("mesh_cp", "CP"), ("mesh_ep", "EP"),
                                      ("TENSOR_MODEL_PARALLEL_GROUP", "TP"), ("data_parallel", "DP"),
                                      ("pipeline_model_parallel", "PP"), ("expert_parallel", "EP"),
                                      ("context_parallel", "CP")])
def test_dimension_from_description(desc, dim):
    assert dimension_of("7", {"desc": desc, "ranks": [0, 1]}, 8)[0] == dim


def test_world_and_unknown_groups():
    assert dimension_of("0", {"desc": "default_pg", "ranks": [0, 1, 2, 3]}, 4)[0] == "world"
    assert dimension_of("5", {"desc": "undefined", "ranks": [0, 2]}, 4)[0] == "group 5"
    assert dimension_of("5", None, 4, {"5": "PP"}) == ("PP", "--groups (name)")


def test_busbw_factor_table_equals_the_cost_models():
    from ccoverlap.cost.comm import bus_bandwidth_factor
    from ccoverlap.trace.collectives import busbw_factor

    for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"):
        for n in (1, 2, 3, 8, 64, 128):
            assert busbw_factor(c, n) == pytest.approx(bus_bandwidth_factor(c, n))
