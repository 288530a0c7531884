"""Overlapped communication + computation on torch.distributed (needs torch; NCCL or gloo).

Public API:

* tensor-parallel layers: the drop-in styles for torch's ``parallelize_module``
  (:mod:`ccoverlap.runtime.tp`): :class:`ColwiseParallel`, :class:`RowwiseParallel`,
  :class:`PrepareModuleInput`, :class:`SequenceParallel` (torch's), and
  :func:`load_full_state_dict` / :func:`full_state_dict`;
* ops (differentiable, forward and backward overlapped): :func:`all_gather_matmul`,
  :func:`matmul_reduce_scatter`, :func:`all_to_all_matmul`; schedules
  :data:`ALL_SCHEDULES` (``serial``, ``ring``, the four FiCCO schedules, ``auto``, ``tune``);
* Centauri's communication partition: :mod:`ccoverlap.runtime.partition`;
* the collectives layer: :mod:`ccoverlap.runtime.comm`;
* shape agreement across ranks: :func:`set_shape_check`, :class:`ShapeMismatchError`.

The process-group layers of :mod:`ccoverlap.runtime.layers` (``ColumnParallelLinear``,
``RowParallelLinear``, ``TransformerBlock``, ``ParallelTransformerBlock``,
``allreduce_sequence_parallel_grads``) are internal; importing them from this package still
works but warns (import them from :mod:`ccoverlap.runtime.layers`, or use the styles above).
"""

import warnings

from ccoverlap.runtime.checks import ShapeMismatchError, get_shape_check, set_shape_check
from ccoverlap.runtime.expert import A2A_SCHEDULES, all_to_all_matmul
from ccoverlap.runtime.ops import ALL_SCHEDULES, COMM_ENGINES, all_gather_matmul, matmul_reduce_scatter
from ccoverlap.runtime.schedules import FICCO_SCHEDULES, SCHEDULES
from ccoverlap.runtime.tp import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    full_state_dict,
    load_full_state_dict,
)
from ccoverlap.runtime.tuning import (
    auto_choice,
    clear_tuning_cache,
    get_tune_options,
    set_tune_cache_file,
    set_tune_options,
    tuning_cache,
)

__all__ = [
    "ColwiseParallel",
    "RowwiseParallel",
    "PrepareModuleInput",
    "SequenceParallel",
    "load_full_state_dict",
    "full_state_dict",
    "all_gather_matmul",
    "matmul_reduce_scatter",
    "all_to_all_matmul",
    "ALL_SCHEDULES",
    "SCHEDULES",
    "FICCO_SCHEDULES",
    "A2A_SCHEDULES",
    "COMM_ENGINES",
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

#: Names this package exported before the styles of :mod:`ccoverlap.runtime.tp` became its one layer API.
_INTERNAL_LAYERS = (
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TransformerBlock",
    "ParallelTransformerBlock",
    "allreduce_sequence_parallel_grads",
)


def __getattr__(name: str) -> object:
    """``ccoverlap.runtime.ColumnParallelLinear`` and the other internal layers: still there, with a warning."""
    if name in _INTERNAL_LAYERS:
        from ccoverlap.runtime import layers

        warnings.warn(
            f"ccoverlap.runtime.{name} is internal now: import it from ccoverlap.runtime.layers, or build the "
            "layer with torch's parallelize_module and ccoverlap.runtime's ColwiseParallel / RowwiseParallel / "
            "PrepareModuleInput (docs/runtime.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(layers, name)
    raise AttributeError(f"module 'ccoverlap.runtime' has no attribute {name!r}")
