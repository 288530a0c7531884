"""Overlapped communication + computation on torch.distributed (needs torch; NCCL or gloo).

Public API:

* ops (differentiable, forward and backward overlapped): :func:`all_gather_matmul`,
  :func:`matmul_reduce_scatter`, :func:`all_to_all_matmul`; schedules
  :data:`ALL_SCHEDULES` (``serial``, ``ring``, the four FiCCO schedules, ``auto``, ``tune``);
* layers: :class:`ColumnParallelLinear`, :class:`RowParallelLinear`,
  :class:`ParallelTransformerBlock` (+ the single-process :class:`TransformerBlock`) and
  :func:`allreduce_sequence_parallel_grads`;
* Centauri's communication partition: :mod:`ccoverlap.runtime.partition`;
* the collectives layer: :mod:`ccoverlap.runtime.comm`;
* shape agreement across ranks: :func:`set_shape_check`, :class:`ShapeMismatchError`.
"""

from ccoverlap.runtime.checks import ShapeMismatchError, get_shape_check, set_shape_check
from ccoverlap.runtime.expert import A2A_SCHEDULES, all_to_all_matmul
from ccoverlap.runtime.layers import (
    ColumnParallelLinear,
    ParallelTransformerBlock,
    RowParallelLinear,
    TransformerBlock,
    allreduce_sequence_parallel_grads,
)
from ccoverlap.runtime.ops import ALL_SCHEDULES, COMM_ENGINES, all_gather_matmul, matmul_reduce_scatter
from ccoverlap.runtime.schedules import FICCO_SCHEDULES, SCHEDULES
from ccoverlap.runtime.tuning import (
    auto_choice,
    clear_tuning_cache,
    get_tune_options,
    set_tune_cache_file,
    set_tune_options,
    tuning_cache,
)

__all__ = [
    "all_gather_matmul",
    "matmul_reduce_scatter",
    "all_to_all_matmul",
    "ALL_SCHEDULES",
    "SCHEDULES",
    "FICCO_SCHEDULES",
    "A2A_SCHEDULES",
    "COMM_ENGINES",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TransformerBlock",
    "ParallelTransformerBlock",
    "allreduce_sequence_parallel_grads",
    "ShapeMismatchError",
    "set_shape_check",
    "get_shape_check",
    "auto_choice",
    "tuning_cache",
    "clear_tuning_cache",
    "set_tune_options",
    "get_tune_options",
    "set_tune_cache_file",
]
