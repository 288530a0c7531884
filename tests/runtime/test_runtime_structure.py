"""How the runtime is put together (its imports: the contracts of .importlinter): one ``schedule=`` check shared by
the ops, the tensor-parallel styles and the internal layers, and one public layer API."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from ccoverlap.errors import ConfigError  # noqa: E402
from ccoverlap.runtime import layers, ops, tp, tuning  # noqa: E402
from ccoverlap.runtime.schedules import FICCO_SCHEDULES  # noqa: E402


def test_the_ops_register_what_tuning_times():
    assert tuning._op("ag") is ops.all_gather_matmul
    assert tuning._op("rs") is ops.matmul_reduce_scatter
    with pytest.raises(ValueError, match="unknown op kind"):
        tuning.register_op("a2a", ops.all_gather_matmul)


EXPECTED = "schedule must be one of serial, ring, " + ", ".join(FICCO_SCHEDULES) + ", auto, tune; got 'bogus'"


@pytest.mark.parametrize(
    "call",
    [
        lambda: ops.check_schedule("bogus"),
        lambda: ops.all_gather_matmul(torch.randn(2, 4), torch.randn(3, 4), schedule="bogus"),
        lambda: ops.matmul_reduce_scatter(torch.randn(2, 4), torch.randn(3, 4), schedule="bogus"),
        lambda: tp.ColwiseParallel(schedule="bogus"),
        lambda: tp.RowwiseParallel(schedule="bogus"),
        lambda: layers.ColumnParallelLinear(4, 4, schedule="bogus"),
        lambda: layers.RowParallelLinear(4, 4, schedule="bogus"),
        lambda: layers.ParallelTransformerBlock(4, 2, 8, schedule="bogus"),
    ],
    ids=["check_schedule", "all_gather_matmul", "matmul_reduce_scatter", "ColwiseParallel", "RowwiseParallel",
         "ColumnParallelLinear", "RowParallelLinear", "ParallelTransformerBlock"],
)  # fmt: skip
def test_one_schedule_check_one_message(call):
    # before any communication: none of these needs a process group to reject the schedule
    with pytest.raises(ConfigError) as err:
        call()
    assert str(err.value) == EXPECTED


def test_check_schedule_returns_the_index_the_cross_rank_check_sends():
    assert [ops.check_schedule(s) for s in ops.ALL_SCHEDULES] == list(range(len(ops.ALL_SCHEDULES)))


def test_the_public_layer_api_is_the_tp_styles():
    import ccoverlap.runtime as rt

    for name in ("ColwiseParallel", "RowwiseParallel", "PrepareModuleInput", "SequenceParallel",
                 "load_full_state_dict", "full_state_dict"):  # fmt: skip
        assert name in rt.__all__ and getattr(rt, name) is getattr(tp, name)
    for name in rt._INTERNAL_LAYERS:
        assert name not in rt.__all__
        with pytest.warns(DeprecationWarning, match=f"ccoverlap.runtime.{name} is internal now"):
            assert getattr(rt, name) is getattr(layers, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            rt.NoSuchLayer  # noqa: B018
