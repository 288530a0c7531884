"""`ccoverlap validate collectives`: the communication model against the collective corpus —
the shipped tables, the statistics checked by hand on a small table, bad tables as one clear
error, and the fit recovering a parameter it was not given."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from ccoverlap.catalog.hardware import get_cluster
from ccoverlap.cli import main
from ccoverlap.corpus.tables import load_kind
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import ConfigError
from ccoverlap.validation.collectives import (
    FIT,
    FIT_CLUSTER,
    KIND,
    Case,
    cluster_value,
    fit_params,
    predict_s,
    report_lines,
    table_cases,
    validate_corpus,
    with_cluster_value,
)

META = """source: {repository: example/bench, path: t.csv, commit: abc, licence: MIT}
hardware: 8 x H100 SXM
gpu: H100-SXM
units: {nbytes: bytes, time_s: s}
split_key: [collective, gpus, nodes, nbytes]
"""
MiB = 1 << 20


def _write(root, rows, name="t", meta=META):
    d = root / KIND
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(meta)
    (d / f"{name}.csv").write_text("cluster,collective,gpus,nodes,nbytes,time_s\n" + "".join(rows))


def _predicted(cluster, coll, gpus, nodes, nbytes):
    case = Case("t", get_cluster(cluster).with_nodes(max(2, nodes)), coll, gpus, nodes, float(nbytes), 1.0)
    return predict_s(case)


def test_every_shipped_table_is_judged_on_its_held_out_half():
    tables = load_kind(KIND)
    assert len(tables) >= 8
    groups = validate_corpus("held-out")
    assert {g.table for g in groups} == {t.name for t in tables}
    assert sum(g.n for g in groups) == sum(len(t.half("held-out")) for t in tables)
    assert sum(g.n for g in validate_corpus("all")) == sum(len(t.rows) for t in tables)
    for t in tables:  # every row maps to a catalog cluster of the table's GPU
        assert {c.cluster.gpu.name for c in table_cases(t, "all")} == {t.gpu}


def test_cli_prints_the_groups_and_one_json_object(capsys):
    assert main(["validate", "collectives", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "held-out" and out["total"] == len(out["groups"]) > 0
    assert out["met"] == sum(g["ok"] for g in out["groups"])
    assert main(["validate", "collectives", "--split", "fit"]) == 0
    text = capsys.readouterr().out
    assert "fit half" in text and "vidur_a40_all_reduce  (a40-nvlink, A40)" in text


def test_statistics_match_a_hand_computation(tmp_path):
    """Measured times are set to predicted / (1 + e) for chosen errors e, so the printed
    median |error| and mean signed error are known by hand."""
    small = {1 * MiB: 0.10, 2 * MiB: -0.20, 4 * MiB: 0.40}      # median |e| 0.20, mean +0.10
    large = {64 * MiB: -0.05, 256 * MiB: 0.07}                  # median |e| 0.06, mean +0.01
    multi = {64 * MiB: -0.30, 128 * MiB: 0.10}                  # mean signed -0.10
    rows = [f"dgx-h100,all_reduce,8,1,{m},{_predicted('dgx-h100', 'all_reduce', 8, 1, m) / (1 + e)!r}\n"
            for d in (small, large) for m, e in d.items()]
    rows += [f"dgx-h100,send_recv,2,2,{m},{_predicted('dgx-h100', 'send_recv', 2, 2, m) / (1 + e)!r}\n"
             for m, e in multi.items()]
    _write(tmp_path, rows)
    groups = {(g.collective, g.size_class): g for g in validate_corpus("all", root=tmp_path)}
    g_small, g_large, g_multi = (groups[("all_reduce", "< 16 MiB")], groups[("all_reduce", ">= 16 MiB")],
                                 groups[("send_recv", "multi-node")])
    assert (g_small.n, g_large.n, g_multi.n) == (3, 2, 2)
    assert g_small.median_abs == pytest.approx(0.20) and g_small.mean_signed == pytest.approx(0.10)
    assert g_large.median_abs == pytest.approx(0.06) and g_large.mean_signed == pytest.approx(0.01)
    assert g_multi.mean_signed == pytest.approx(-0.10) and g_multi.median_abs == pytest.approx(0.20)
    assert (g_small.ok, g_large.ok, g_multi.ok) == (False, True, True)
    lines = report_lines(list(groups.values()), "all")
    assert "  all_reduce < 16 MiB     3 rows  median |err|  20.0%  mean  +10.0%  MISS" in lines
    assert "  send_recv  multi-node   2 rows  median |err|  20.0%  mean  -10.0%  ok" in lines
    assert lines[-1] == "2 of 3 groups meet their target"


@pytest.mark.parametrize("row, message", [
    ("dgx-x,all_reduce,8,1,1024,1e-5\n", "unknown cluster"),
    ("dgx-h100,all_scatter,8,1,1024,1e-5\n", r"row 2: unknown collective 'all_scatter'"),
    ("dgx-h100,all_reduce,16,1,1024,1e-5\n", "row 2: 16 GPUs on 1 node"),
    ("dgx-h100,all_reduce,8,1,1024,-1\n", "row 2: time_s must be a positive number"),
    ("dgx-h100,all_reduce,8.5,1,1024,1e-5\n", "row 2: gpus must be a positive whole number"),
    ("dgx-h100,send_recv,4,1,1024,1e-5\n", "send_recv rows are between 2 GPUs"),
])
def test_a_bad_row_is_one_clear_error(tmp_path, row, message):
    _write(tmp_path, [row])
    with pytest.raises(ConfigError, match=message):
        validate_corpus("all", root=tmp_path)


def test_a_table_without_the_columns_is_one_clear_error(tmp_path):
    _write_table(tmp_path, "op,size\nar,1\n", META.replace("[collective, gpus, nodes, nbytes]", "[op]"))
    with pytest.raises(ConfigError, match=r"collective table t: missing column\(s\) cluster, collective"):
        validate_corpus("all", root=tmp_path)


def test_split_must_be_a_half(tmp_path):
    _write(tmp_path, ["dgx-h100,all_reduce,8,1,1024,1e-5\n"])
    with pytest.raises(ConfigError, match="corpus split must be one of"):
        validate_corpus("most", root=tmp_path)


def test_split_flag_belongs_to_collectives(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "runs.yaml"), "--split", "fit"]) == 2
    assert "--split is for 'ccoverlap validate collectives' and 'ccoverlap validate kernels'" in capsys.readouterr().err


def test_fit_recovers_a_parameter_from_rows_it_generated():
    """Rows made by the model with comm_base_latency_s = 30 us and PCIe efficiency 0.6 are fitted
    back from the defaults to those values."""
    cluster = get_cluster("h100-nvl-nvlink-pairs")
    truth = default_params(cluster.gpu).with_overrides(comm_base_latency_s=30e-6, link_efficiency_pcie=0.6)
    cases = []
    for m in (64 << 10, 1 << 20, 16 << 20, 256 << 20):
        for n in (2, 4):
            c = Case("t", cluster, "all_reduce", n, 1, float(m), 1.0)
            cases.append(Case("t", cluster, "all_reduce", n, 1, float(m), predict_s(c, truth)))
    got = fit_params(cases, ["comm_base_latency_s", "link_efficiency_pcie"], default_params(cluster.gpu))
    assert got["comm_base_latency_s"] == pytest.approx(30e-6, rel=0.02)
    assert got["link_efficiency_pcie"] == pytest.approx(0.6, rel=0.02)
    with pytest.raises(ConfigError, match="cannot fit"):
        fit_params(cases, ["gemm_peak_fraction"], truth)


def test_shipped_defaults_are_the_fit_of_the_fit_half():
    """The A40 communication values in params.py are what the fit script's least squares
    returns on the A40 table's fit half (rounded as written there)."""
    t = next(t for t in load_kind(KIND) if t.name == "vidur_a40_all_reduce")
    base = default_params(get_cluster("a40-nvlink").gpu)
    got = fit_params(table_cases(t, "fit"), FIT["A40"], base)
    for name, value in got.items():
        assert value == pytest.approx(getattr(base, name), abs=0.02 if name.startswith(("link", "pcie")) else 1e-6)
    assert statistics.median(abs(predict_s(c) / c.measured_s - 1) for c in table_cases(t, "fit")) < 0.15


def test_a_cluster_s_own_host_issue_time_is_its_loops_floor():
    """A small all-reduce in a loop is held to the host issue time of the cluster's nodes where
    the catalog gives one, else to the GPU's comm_host_issue_s: two clusters of one GPU differ."""
    dgx, pairs = get_cluster("dgx-h100"), get_cluster("h100-nvl-nvlink-pairs")
    p = default_params(dgx.gpu)
    assert dgx.host_issue_s > 0 and pairs.host_issue_s > 0 and dgx.host_issue_s != pairs.host_issue_s
    small = Case("t", dgx, "all_reduce", 2, 1, 1024.0, 1.0)
    assert predict_s(small) == pytest.approx(dgx.host_issue_s)
    assert predict_s(Case("t", pairs, "all_reduce", 2, 1, 1024.0, 1.0)) == pytest.approx(pairs.host_issue_s)
    bare = with_cluster_value(dgx, "host_issue_s", 0.0)
    assert predict_s(Case("t", bare, "all_reduce", 2, 1, 1024.0, 1.0)) == pytest.approx(p.comm_host_issue_s)


def test_cluster_fields_are_read_and_set():
    c = get_cluster("a3-mega")
    assert cluster_value(with_cluster_value(c, "inter_latency_s", 7e-6), "inter_latency_s") == 7e-6
    assert cluster_value(with_cluster_value(c, "host_issue_s", 9e-6), "host_issue_s") == 9e-6
    with pytest.raises(ConfigError, match="not a cluster field"):
        with_cluster_value(c, "gemm_peak_fraction", 1.0)


def test_fit_recovers_a_cluster_s_inter_node_latency():
    """2-node rows made with a 40 us hop between the nodes are fitted back to it, the cluster
    field set in every case's cluster."""
    truth = with_cluster_value(get_cluster("dgx-h100", nodes=2), "inter_latency_s", 40e-6)
    p = default_params(truth.gpu)
    cases = []
    for m in (4 << 10, 256 << 10, 4 << 20):
        made = predict_s(Case("t", truth, "send_recv", 2, 2, float(m), 1.0), p)
        cases.append(Case("t", get_cluster("dgx-h100", nodes=2), "send_recv", 2, 2, float(m), made))
    got = fit_params(cases, ["inter_latency_s"], p)
    assert got["inter_latency_s"] == pytest.approx(40e-6, rel=0.02)


@pytest.mark.parametrize("cluster", ["dgx-h100", "a3-mega", "aws-p5", "aws-p4d", "azure-nd-a100-v4"])
def test_shipped_cluster_values_are_the_fit_of_their_fit_half(cluster):
    """The catalog's host issue time of dgx-h100, a3-mega's TCPXO hop latency and Ethernet
    efficiency, and the EFA hop latency and efficiency of aws-p5 / aws-p4d are what the fit
    script returns on their tables' fit half (as written there)."""
    c = get_cluster(cluster)
    base = default_params(c.gpu)
    cases = [x for t in load_kind(KIND) for x in table_cases(t, "fit") if x.cluster.name == cluster]
    got = fit_params(cases, FIT_CLUSTER[cluster], base)
    for name, value in got.items():
        shipped = cluster_value(c, name) if name in ("host_issue_s", "inter_latency_s") else getattr(base, name)
        assert value == pytest.approx(shipped, rel=0.01)


def test_cli_bad_table_is_one_line_and_json_says_so(tmp_path, monkeypatch, capsys):
    import ccoverlap.corpus.tables as tables

    _write(tmp_path, ["dgx-h100,all_reduce,8,1,1024,0\n"])
    monkeypatch.setattr(tables, "CORPUS_DIR", tmp_path)
    assert main(["validate", "collectives"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "collective table t, row 2: time_s must be a positive number" in err[0]
    assert main(["validate", "collectives", "--json", "--split", "all"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "all" and out["groups"] == [] and "time_s must be a positive" in out["error"]


#: the public nccl-tests tables across nodes over AWS EFA and on one NVSwitch node, by name:
#: (catalog cluster, GPU, rows, GPUs, nodes)
NCCL_TESTS_TABLES = {
    "nccl_tests_aws_p5_h100_2x8_all_reduce": ("aws-p5", "H100-SXM", 32, 16, 2),
    "nccl_tests_aws_p4d_a100_2x8_all_reduce": ("aws-p4d", "A100-80GB-SXM", 28, 16, 2),
    "nccl_tests_h100_nvswitch_1x8_all_reduce": ("dgx-h100", "H100-SXM", 6, 8, 1),
    "dgxc_benchmarking_h100_1x8_all_reduce": ("dgx-h100", "H100-SXM", 32, 8, 1),
    "azure_nd_h100_v5_1x8_all_reduce": ("azure-nd-h100-v5", "H100-SXM", 22, 8, 1),
    "azure_nd_a100_v4_1x8_all_reduce": ("azure-nd-a100-v4", "A100-80GB-SXM", 21, 8, 1),
}


@pytest.mark.parametrize("name", sorted(NCCL_TESTS_TABLES))
def test_nccl_tests_tables_are_read_with_their_source_and_counted(name):
    """Each table loads with its source (repository, path, commit, licence, url), maps every row
    to its catalog cluster, and every row is judged in one of its two halves."""
    cluster, gpu, rows, gpus, nodes = NCCL_TESTS_TABLES[name]
    t = next(t for t in load_kind(KIND) if t.name == name)
    assert t.gpu == gpu and len(t.rows) == rows
    assert t.source.repository and t.source.path and t.source.commit and t.source.licence
    assert t.source.url.startswith("https://github.com/")
    cases = table_cases(t, "all")
    assert {c.cluster.name for c in cases} == {cluster}
    assert {(c.gpus, c.nodes) for c in cases} == {(gpus, nodes)}
    # nccl-tests' busbw column agrees with the kept time (2(n-1)/n x size / time), to its rounding
    for r in t.rows:
        busbw = r["nbytes"] / r["time_s"] * 2 * (gpus - 1) / gpus / 1e9
        assert busbw == pytest.approx(r["busbw_gbs"], abs=0.011 + 0.002 * busbw)
    held = [g for g in validate_corpus("held-out", names=[name])]
    assert sum(g.n for g in held) == len(t.half("held-out")) > 0


def test_efa_step_sets_a_small_all_reduce_across_p5_nodes():
    """A 2 x 8 all-reduce of 8 B-1 KiB on two p5.48xlarge takes 77-88 us (the p5 table): the
    time of NCCL's step across EFA, not the wire's few microseconds. The model, with the EFA
    hop fitted on the table's fit half, stays within 20% of every such row."""
    t = next(t for t in load_kind(KIND) if t.name == "nccl_tests_aws_p5_h100_2x8_all_reduce")
    small = [c for c in table_cases(t, "all") if c.nbytes <= 1024]
    assert len(small) == 8
    for c in small:
        assert 0.8 < predict_s(c) / c.measured_s < 1.2


def test_efa_links_take_the_gpu_s_efa_efficiency():
    """A cluster whose nodes talk over EFA reaches its GPU's link_efficiency_efa of the EFA line,
    not InfiniBand's: a large 2-node all-reduce on aws-p5 slows as that efficiency falls."""
    p5 = get_cluster("aws-p5")
    p = default_params(p5.gpu)
    assert p.link_efficiency("efa") == p.link_efficiency_efa != p.link_efficiency("infiniband")
    big = Case("t", p5, "all_reduce", 16, 2, float(1 << 30), 1.0)
    assert predict_s(big, p.with_overrides(link_efficiency_efa=0.4)) > 1.5 * predict_s(big, p)


@pytest.mark.parametrize("name", ["nccl_tests_aws_p5_h100_2x8_all_reduce", "nccl_tests_aws_p4d_a100_2x8_all_reduce"])
def test_efa_tables_meet_the_multi_node_target_on_their_held_out_half(name):
    (group,) = validate_corpus("held-out", names=[name])
    assert group.size_class == "multi-node" and group.ok


def test_the_h100_nvls_latency_and_ll_step_are_the_fit_of_the_fit_half():
    """params.nvls_latency_s and the H100's proto_ll_latency_factor are what the fit script
    returns over the H100 tables' fit halves (vidur's, the forced-NVLS nccl-tests run, and the
    dgxc nccl-tests sweep whose small all-reduces are LL rings), with the other H100 values."""
    from ccoverlap.validation.collectives import NOT_FITTED

    base = default_params(get_cluster("dgx-h100").gpu)
    cases = [c for t in load_kind(KIND) if t.gpu == "H100-SXM" and t.name not in NOT_FITTED
             for c in table_cases(t, "fit")]
    # each cluster's own host issue time set aside, as the fit script does; every other field kept
    cases = [replace(c, cluster=with_cluster_value(c.cluster, "host_issue_s", 0.0)) for c in cases]
    assert {c.table for c in cases} >= {"azure_nd_h100_v5_1x8_all_reduce", "vidur_h100_dgx_all_reduce",
                                        "dgxc_benchmarking_h100_1x8_all_reduce"}
    got = fit_params(cases, FIT["H100-SXM"], base)
    assert got["nvls_latency_s"] == pytest.approx(base.nvls_latency_s, rel=0.02)
    assert got["proto_ll_latency_factor"] == pytest.approx(base.proto_ll_latency_factor, rel=0.02)
    assert base.proto_ll_latency_factor != CostParams().proto_ll_latency_factor  # fitted, not the class default


ALG_META = META.replace("split_key", "notes: forced\nsplit_key")


def _write_table(tmp_path, csv: str, meta: str = META):
    """One corpus table ``t`` under ``tmp_path`` with ``csv`` as its rows (header first)."""
    d = tmp_path / KIND
    d.mkdir(parents=True)
    (d / "t.yaml").write_text(meta)
    (d / "t.csv").write_text(csv)


def _table_cases(tmp_path, csv: str):
    """The cases of a one-table corpus written by :func:`_write_table`, every row."""
    from ccoverlap.corpus.tables import load_table

    _write_table(tmp_path, csv)
    return table_cases(load_table(KIND, "t", root=tmp_path), "all")


def test_a_forced_algorithm_column_is_what_the_row_is_predicted_with(tmp_path):
    """An ``algorithm`` cell (NCCL_ALGO as run) forces that algorithm; an empty one leaves the
    model's choice. A small 8 x H100 all-reduce forced to NVLS pays NVLS's fixed latency."""
    forced, free = _table_cases(tmp_path, "cluster,collective,gpus,nodes,nbytes,time_s,algorithm\n"
                                          "azure-nd-h100-v5,all_reduce,8,1,1048576,1e-4,nvls\n"
                                          "azure-nd-h100-v5,all_reduce,8,1,1048576,1e-4,\n")
    assert (forced.algorithm, free.algorithm) == ("nvls", "auto")
    p = default_params(forced.cluster.gpu)
    assert collective_nvls_floor(p) < predict_s(forced)
    assert predict_s(free) < predict_s(forced)


def collective_nvls_floor(p):
    return p.comm_base_latency_s + p.nvls_latency_s


@pytest.mark.parametrize("row, message", [
    ("dgx-h100,all_reduce,8,1,1024,1e-5,bogus\n", "algorithm must be one of"),
    ("dgx-h100,send_recv,2,1,1024,1e-5,ring\n", "no algorithm to force"),
    ("dgx-a100,all_reduce,8,1,1024,1e-5,nvls\n", "needs one NVSwitch node of a GPU with NVLink SHARP"),
])
def test_a_bad_forced_algorithm_is_one_clear_error(tmp_path, row, message):
    _write_table(tmp_path, "cluster,collective,gpus,nodes,nbytes,time_s,algorithm\n" + row)
    with pytest.raises(ConfigError, match=message):
        validate_corpus("all", root=tmp_path)


def test_an_nccl_tests_issuer_is_not_held_to_the_eager_pytorch_floor(tmp_path):
    """A row whose ``issuer`` is nccl-tests (a C loop calling NCCL) is predicted at the
    collective's own time; the same row without the column is held to dgx-h100's floor, the
    issue time of an eager-PyTorch loop (37 us, far above a small all-reduce's GPU time)."""
    c_loop, eager = _table_cases(tmp_path, "cluster,collective,gpus,nodes,nbytes,time_s,issuer\n"
                                           "dgx-h100,all_reduce,8,1,1024,1.5e-5,nccl-tests\n"
                                           "dgx-h100,all_reduce,8,1,1024,1.5e-5,\n")
    assert (c_loop.issuer, eager.issuer) == ("nccl-tests", "")
    floor = get_cluster("dgx-h100").host_issue_s
    assert predict_s(eager) == pytest.approx(floor)
    assert predict_s(c_loop) < 0.5 * floor


def test_a_bad_issuer_is_one_clear_error(tmp_path):
    _write_table(tmp_path, "cluster,collective,gpus,nodes,nbytes,time_s,issuer\n"
                           "dgx-h100,all_reduce,8,1,1024,1e-5,mpi\n")
    with pytest.raises(ConfigError, match="issuer must be one of"):
        validate_corpus("all", root=tmp_path)


def test_the_dgxc_table_is_a_c_loop_and_its_large_sizes_meet_their_target():
    """NVIDIA/dgxc-benchmarking's one-node 8 x H100 all-reduce (8 B-16 GiB, NCCL's own choices):
    every row is marked as nccl-tests' loop, and its held-out rows at >= 16 MiB (NVLS from 32 MiB)
    meet the 10% target."""
    name = "dgxc_benchmarking_h100_1x8_all_reduce"
    t = next(t for t in load_kind(KIND) if t.name == name)
    assert t.source.repository == "NVIDIA/dgxc-benchmarking" and t.source.licence == "MIT"
    assert {c.issuer for c in table_cases(t, "all")} == {"nccl-tests"}
    large = [g for g in validate_corpus("held-out", names=[name]) if g.size_class == ">= 16 MiB"]
    assert len(large) == 1 and large[0].ok


#: xxrjun/nccl-tests-cluster's H100 runs, by name: (rows, {(GPUs, nodes)}, collectives)
CLUSTER_RUN_TABLES = {
    "nccl_tests_cluster_h100_1x8_collectives": (80, {(8, 1), (4, 1)}),
    "nccl_tests_cluster_h100_10x8_collectives": (160, {(10, 10), (20, 10), (40, 10), (80, 10)}),
}


@pytest.mark.parametrize("name", sorted(CLUSTER_RUN_TABLES))
def test_cluster_run_tables_are_read_with_their_source_and_judged(name):
    """Each table of the 8 x H100 cluster's nccl-tests runs loads with its source, holds
    all-reduce, all-gather, reduce-scatter and all-to-all rows of the shapes it names (nccl-tests'
    busbw agreeing with the kept time for each collective's factor), is a C loop, and is judged
    on its held-out half in four groups."""
    from ccoverlap.cost.comm import bus_bandwidth_factor

    rows, shapes = CLUSTER_RUN_TABLES[name]
    t = next(t for t in load_kind(KIND) if t.name == name)
    assert t.source.repository == "xxrjun/nccl-tests-cluster" and t.source.licence == "Apache-2.0"
    assert t.source.commit and t.source.path and t.source.url.startswith("https://github.com/")
    cases = table_cases(t, "all")
    assert len(cases) == rows and {(c.gpus, c.nodes) for c in cases} == shapes
    assert {c.collective for c in cases} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    assert {c.issuer for c in cases} == {"nccl-tests"} and {c.cluster.name for c in cases} == {"dgx-h100"}
    for c, r in zip(cases, t.rows):
        busbw = c.nbytes / c.measured_s * bus_bandwidth_factor(c.collective, c.gpus) / 1e9
        assert busbw == pytest.approx(r["busbw_gbs"], abs=0.011 + 0.002 * busbw)
    groups = validate_corpus("held-out", names=[name])
    assert len(groups) == 4 and sum(g.n for g in groups) == len(t.half("held-out"))


def test_one_gpu_a_node_reaches_one_nic_across_ten_nodes():
    """With one GPU on each of 10 nodes every collective of the cluster run levels off at one
    400 Gb/s NIC's rate (48.7-48.9 GB/s busbw): the table's own evidence of a NIC a GPU."""
    t = next(t for t in load_kind(KIND) if t.name == "nccl_tests_cluster_h100_10x8_collectives")
    peak = {}
    for r in t.rows:
        if r["gpus"] == 10 and r["collective"] != "all_to_all":
            peak[r["collective"]] = max(peak.get(r["collective"], 0.0), r["busbw_gbs"])
    assert set(peak) == {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(46.0 < v < 50.0 for v in peak.values())
