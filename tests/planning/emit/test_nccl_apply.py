"""Stock NCCL's settings for per-communication configurations: the tuner CSV and environment
formats (against the pinned, documented formats), and the rules of what applies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ccoverlap.catalog.hardware import get_cluster
from ccoverlap.errors import ConfigError
from ccoverlap.nccl.apply import (
    TUNER_COLLECTIVES,
    TunerRow,
    match_row,
    nccl_env_text,
    parse_nccl_env,
    parse_tuner_csv,
    pinned_options,
    stock_nccl_settings,
    tuner_csv_text,
)
from ccoverlap.nccl.plan import CommKey
from ccoverlap.predict.evaluate import cost_model_for_cluster
from ccoverlap.specs import CollectiveSpec, CommConfig, GroupSpec

# the example plugin's documented row (NVIDIA/nccl plugins/tuner/example/README.md)
DOCUMENTED_COLUMNS = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
MiB = 2**20


def test_the_pinned_format_is_the_plugins_documented_one():
    spec = pinned_options()["nccl"]["tuner_csv"]
    assert ",".join(spec["columns"]) == DOCUMENTED_COLUMNS
    assert set(spec["collective_types"].values()) == {"broadcast", "reduce", "allgather", "reducescatter",
                                                      "allreduce"}
    assert spec["protocols"] == ["ll", "ll128", "simple"]
    assert dict(TUNER_COLLECTIVES) == spec["collective_types"]
    for name, entry in pinned_options()["nccl"]["env"].items():
        assert name.startswith("NCCL_") and entry["file"] and entry["what"]


def test_csv_rows_round_trip_and_every_line_fits_the_plugins_buffer():
    rows = [TunerRow("allgather", 1, 100, "ring", "simple", 8, 1, 4, comment="x" * 400),
            TunerRow("allreduce", 0, 4294967295, "tree", "ll", -1, -1, 8)]
    text = tuner_csv_text(rows, header="a header line")
    assert all(len(line) <= 255 for line in text.splitlines())
    assert "# " + DOCUMENTED_COLUMNS in text.splitlines()  # the column names as a comment, never a row
    back = parse_tuner_csv(text)
    assert back == rows
    assert text.splitlines()[-1] == "allreduce,0,4294967295,tree,ll,-1,-1,8,-1,-1"


@pytest.mark.parametrize("line,needle", [
    ("allgather,0,10,ring,simple,4,1", "8 to 10"),
    ("allgather,0,10,rings,simple,4,1,4", "algorithm"),
    ("allgather,0,10,ring,Simple,4,1,4", "protocol"),
    ("alltoall,0,10,ring,simple,4,1,4", "collective_type"),
    ("allgather,10,0,ring,simple,4,1,4", "min_bytes"),
    ("allgather,0,10,ring,simple,0,1,4", "channels"),
    ("allgather,0,10,ring,simple,4,1,four", "invalid literal"),
    ("#" + "x" * 300, "longer than 255"),
])
def test_bad_csv_lines_fail_naming_the_line(line, needle):
    with pytest.raises(ConfigError) as exc:
        parse_tuner_csv("# ok\n" + line + "\n", "t.csv")
    assert "t.csv:2:" in str(exc.value) and needle in str(exc.value)


def test_the_first_matching_row_wins_with_inclusive_bounds():
    rows = [TunerRow("allgather", 10, 20, "ring", "simple", 4, 1, 4),
            TunerRow("allgather", 0, 100, "ring", "ll", 2, -1, -1)]
    key = CommKey("dp", "all_gather", 20.0, 4, 4)
    assert match_row(rows, key) is rows[0]  # 20 <= max_bytes: inclusive
    assert match_row(rows, replace(key, nbytes=21.0)) is rows[1]
    assert match_row(rows, replace(key, group_size=8, local_size=8)) is rows[1]  # nRanks 8: only the wildcard row
    assert match_row(rows, CommKey("ep", "all_to_all", 20.0, 4, 4)) is None  # not a tuner collective


def test_env_files_round_trip_and_refuse_unknown_names():
    text = nccl_env_text({"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "1048576"}, {"NCCL_NTHREADS": "why"}, "head")
    assert parse_nccl_env(text) == {"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "1048576"}
    with pytest.raises(ConfigError, match="NCCL_MADE_UP"):
        nccl_env_text({"NCCL_MADE_UP": "1"})
    with pytest.raises(ConfigError, match="nccl.env:2"):
        parse_nccl_env("# c\nNCCL_MADE_UP=1\n")
    with pytest.raises(ConfigError, match="NAME=value"):
        parse_nccl_env("export\n")


# ----------------------------------------------------------------------------- the rules

CLUSTER = get_cluster("dgx-h100", nodes=2)
COST = cost_model_for_cluster(CLUSTER)


def resolve(key: CommKey, cfg: CommConfig) -> CommConfig:
    spec = CollectiveSpec(collective=key.collective, bytes=key.nbytes,
                          group=GroupSpec(name=key.group, size=key.group_size, local_size=key.local_size), config=cfg)
    return COST.comm_config(spec)


AG = CommKey("dp", "all_gather", 200 * MiB, 8, 8)
RS = CommKey("dp", "reduce_scatter", 400 * MiB, 8, 8)
TP = CommKey("tp", "all_reduce", 64 * MiB, 2, 2)


def settings(wanted: dict, weights: dict | None = None):
    keys = list(wanted)
    given = {k: resolve(k, CommConfig()) for k in keys}
    want = {k: resolve(k, wanted[k]) for k in keys}
    return stock_nccl_settings(want, given, weights or {k: 1.0 for k in keys}, resolve), want, given


def test_nothing_changed_sets_nothing():
    n, want, given = settings({AG: CommConfig(), RS: CommConfig()})
    assert not n.env and not n.tuner_rows and not n.groups and not n.dropped
    assert n.applied == want == given


def test_threads_go_to_the_environment_and_the_heavier_value_wins():
    n, want, _ = settings({AG: CommConfig(threads=256, protocol="simple"), RS: CommConfig(threads=128, protocol="simple")},
                          {AG: 3.0, RS: 1.0})
    assert n.env["NCCL_NTHREADS"] == "256"
    assert {k: c.threads for k, c in n.applied.items()} == {AG: 256, RS: 256}
    assert [(d.key, d.knob, d.wanted, d.applied) for d in n.dropped] == [(RS, "threads", 128, 256)]
    assert not n.tuner_rows  # threads have no CSV column


def test_a_thread_count_nccl_would_refuse_is_dropped():
    n, _, given = settings({AG: CommConfig(threads=200, protocol="simple")})
    assert "NCCL_NTHREADS" not in n.env
    assert n.applied[AG].threads == given[AG].threads and n.dropped[0].knob == "threads"


def test_the_simple_ring_chunk_is_half_of_nccl_buffsize_and_other_chunks_stay():
    ll = CommKey("tp", "all_reduce", 64 * 1024, 2, 2)
    n, _, given = settings({AG: CommConfig(chunk_bytes=512 * 1024, protocol="simple", algorithm="ring"),
                            ll: CommConfig(chunk_bytes=8 * 1024, protocol="ll")})
    assert n.env["NCCL_BUFFSIZE"] == str(1024 * 1024)
    assert n.applied[AG].chunk_bytes == 512 * 1024
    assert n.applied[ll].chunk_bytes == given[ll].chunk_bytes
    assert any(d.key == ll and d.knob == "chunk_bytes" for d in n.dropped)


def test_channels_per_size_go_to_the_csv_with_a_row_for_every_collective():
    n, want, _ = settings({AG: CommConfig(channels=4), RS: CommConfig(channels=24), TP: CommConfig()})
    assert {TUNER_COLLECTIVES[k.collective] for k in (AG, RS, TP)} == {r.collective_type for r in n.tuner_rows}
    for k in (AG, RS, TP):  # what the example plugin picks for each call is what was wanted
        row = match_row(n.tuner_rows, k)
        assert (row.algorithm, row.protocol, row.channels) == (want[k].algorithm, want[k].protocol, want[k].channels)
        assert row.n_ranks == k.group_size and row.n_nodes == 1
    assert n.groups["dp"].min_ctas == 4 and n.groups["dp"].max_ctas == 24
    assert "tp" not in n.groups  # its channels did not change
    assert not n.dropped and n.applied == want


def test_two_groups_of_the_same_shape_share_a_row_and_the_lighter_is_dropped():
    other = CommKey("edp", "all_gather", AG.nbytes, 8, 8)
    n, want, _ = settings({AG: CommConfig(channels=4), other: CommConfig(channels=12)}, {AG: 1.0, other: 5.0})
    assert n.applied[AG].channels == n.applied[other].channels == 12
    assert [(d.key, d.knob) for d in n.dropped] == [(AG, "channels")]


def test_an_algorithm_nccl_does_not_have_falls_back_to_its_own_choice():
    two_nodes = CommKey("dp", "all_reduce", 256 * MiB, 16, 8)
    n, _, _ = settings({two_nodes: CommConfig(channels=8, algorithm="hierarchical")})
    assert n.applied[two_nodes].algorithm in pinned_options()["nccl"]["tuner_csv"]["algorithms"]
    assert any(d.knob == "algorithm" and d.wanted == "hierarchical" for d in n.dropped)
    assert match_row(n.tuner_rows, two_nodes).n_nodes == 2


def test_all_to_all_channels_reach_only_through_the_groups_ctas():
    a2a = CommKey("ep", "all_to_all", 32 * MiB, 8, 8)
    n, _, _ = settings({a2a: CommConfig(channels=6)})
    assert not n.tuner_rows  # the plugin is not asked about send/receive
    assert (n.groups["ep"].min_ctas, n.groups["ep"].max_ctas) == (6, 6)
    assert n.applied[a2a].channels == 6 and not n.dropped
