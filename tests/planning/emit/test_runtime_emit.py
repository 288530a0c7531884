"""ccoverlap.runtime.nccl / settings: the emitted files applied in a PyTorch job (CPU; the NCCL
options class replaced by a stand-in with the same attributes)."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.tensor import Replicate, Shard  # noqa: E402

from ccoverlap.errors import ConfigError  # noqa: E402
from ccoverlap.runtime import nccl as rn  # noqa: E402
from ccoverlap.runtime import settings as rs  # noqa: E402
from ccoverlap.runtime import tp as rtp  # noqa: E402


class FakeConfig:
    min_ctas = max_ctas = None


class FakeOptions:
    """ProcessGroupNCCL.Options' attributes (torch/csrc/distributed/c10d/init.cpp)."""

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.is_high_priority_stream = is_high_priority_stream
        self.config = FakeConfig()


@pytest.fixture
def emit_dir(tmp_path):
    (tmp_path / "nccl.env").write_text("# why\nNCCL_NTHREADS=256\nNCCL_BUFFSIZE=1048576\n")
    (tmp_path / "process_groups.json").write_text(json.dumps(
        {"dp": {"ranks": 4, "ranks_per_node": 4, "min_ctas": 4, "max_ctas": 24}}))
    (tmp_path / "framework.json").write_text(json.dumps({
        "pytorch": {"fully_shard": {"reshard_after_forward": False}, "fsdp2_prefetch": {"forward": 2, "backward": 2},
                    "ddp": {"bucket_cap_mb": 50.0}},
        "tp_plan": {"layers.*.attention": {"style": "PrepareModuleInput", "input_layouts": ["Shard(1)"],
                                           "desired_input_layouts": ["Replicate()"]},
                    "layers.*.attention.wq": {"style": "ColwiseParallel", "schedule": "ring", "comm_engine": "sm"},
                    "layers.*.attention.wo": {"style": "RowwiseParallel", "schedule": "uniform-fused-2d",
                                              "comm_engine": "dma", "output_layouts": "Shard(1)"},
                    "norm": {"style": "SequenceParallel"}}}))
    return tmp_path


def test_process_group_options_carry_the_groups_ctas(emit_dir):
    opts = rn.process_group_options(emit_dir, "dp", options_cls=FakeOptions)
    assert (opts.config.min_ctas, opts.config.max_ctas, opts.is_high_priority_stream) == (4, 24, False)
    assert rn.process_group_options(emit_dir, "tp", options_cls=FakeOptions) is None  # NCCL's defaults
    over = rn.device_mesh_backend_override(emit_dir, ("dp", "tp"), options_cls=FakeOptions)
    assert list(over) == ["dp"] and over["dp"][0] == "nccl" and over["dp"][1].config.max_ctas == 24


@pytest.mark.skipif(torch.distributed.is_available() and torch.distributed.is_nccl_available(),
                    reason="this build has NCCL")
def test_without_nccl_there_are_no_options(emit_dir):
    assert rn.process_group_options(emit_dir, "dp") is None
    assert rn.device_mesh_backend_override(emit_dir, ("dp",)) == {}


def test_bad_process_group_files_fail_with_one_message(tmp_path):
    (tmp_path / "process_groups.json").write_text(json.dumps({"dp": {"min_ctas": 9, "max_ctas": 4}}))
    with pytest.raises(ConfigError, match="group 'dp' needs integers 1 <= min_ctas <= max_ctas <= 64"):
        rn.load_process_groups(tmp_path)
    with pytest.raises(ConfigError, match="no such --emit directory"):
        rn.load_process_groups(tmp_path / "nope")


def test_apply_nccl_env_keeps_what_is_already_set(emit_dir, monkeypatch):
    monkeypatch.setenv("NCCL_NTHREADS", "512")
    monkeypatch.delenv("NCCL_BUFFSIZE", raising=False)
    assert rn.apply_nccl_env(emit_dir) == {"NCCL_BUFFSIZE": "1048576"}
    assert os.environ["NCCL_NTHREADS"] == "512"
    assert rn.apply_nccl_env(emit_dir, override=True) == {"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "1048576"}
    assert os.environ["NCCL_NTHREADS"] == "256"


def test_framework_keywords_and_the_tp_plan(emit_dir):
    assert rs.fully_shard_kwargs(emit_dir) == {"reshard_after_forward": False}
    assert rs.ddp_kwargs(emit_dir) == {"bucket_cap_mb": 50.0}
    plan = rs.tp_plan(emit_dir)
    wq, wo = plan["layers.*.attention.wq"], plan["layers.*.attention.wo"]
    assert isinstance(wq, rtp.ColwiseParallel) and (wq.schedule, wq.comm_engine) == ("ring", "sm")
    assert isinstance(wo, rtp.RowwiseParallel) and (wo.schedule, wo.comm_engine) == ("uniform-fused-2d", "dma")
    assert wo.output_layout == Shard(1)
    prep = plan["layers.*.attention"]
    assert isinstance(prep, rtp.PrepareModuleInput)
    assert prep.input_layouts == (Shard(1),) and prep.desired_input_layouts == (Replicate(),)
    assert isinstance(plan["norm"], rtp.SequenceParallel)


@pytest.mark.parametrize("fw,needle", [
    ({"tp_plan": {"x": {"style": "Fancy"}}}, "style must be one of"),
    ({"tp_plan": {"x": {"style": "ColwiseParallel", "chunks": 4}}}, "'chunks' is not one of"),
    ({"tp_plan": {"x": {"style": "ColwiseParallel", "input_layouts": "Shard(x)"}}}, "placement must be"),
    ({"tp_plan": {"x": {"style": "ColwiseParallel", "input_layouts": [["Shard(1)"]]}}}, "placement must be"),
    ({"tp_plan": {"x": {"style": "ColwiseParallel", "schedule": "fastest"}}}, "schedule must be one of"),
])
def test_bad_tp_plans_fail_with_one_message(fw, needle):
    with pytest.raises(ConfigError, match=needle):
        rs.tp_plan(fw)


def test_unknown_framework_keys_are_refused():
    with pytest.raises(ConfigError, match="'limit_all_gathers' is not one of"):
        rs.fully_shard_kwargs({"pytorch": {"fully_shard": {"limit_all_gathers": True}}})


class Block:
    def __init__(self, name):
        self.name, self.fwd, self.bwd = name, None, None

    def set_modules_to_forward_prefetch(self, modules):
        self.fwd = [m.name for m in modules]

    def set_modules_to_backward_prefetch(self, modules):
        self.bwd = [m.name for m in modules]


def test_prefetch_depth_names_the_next_blocks_forward_and_the_previous_backward(emit_dir):
    blocks = [Block(i) for i in range(4)]
    assert rs.apply_fsdp_prefetch(emit_dir, blocks) == 2
    assert [b.fwd for b in blocks] == [[1, 2], [2, 3], [3], None]
    assert [b.bwd for b in blocks] == [None, [0], [1, 0], [2, 1]]
    assert rs.apply_fsdp_prefetch({"pytorch": {}}, blocks) == 0  # FSDP2's own one-ahead prefetch
