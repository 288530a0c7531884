"""Parallelism configurations and the builders that turn a model + parallelism + batch into
the op graph of one training step (see :func:`build_step`), plus the per-GPU memory estimate."""

from ccoverlap.parallel.config import BatchConfig, OverlapKnobs, ParallelConfig, config_problems, validate
from ccoverlap.parallel.memory import MemoryEstimate, estimate_memory, layer_activation_bytes
from ccoverlap.parallel.step import StepGraph, build_step

__all__ = ["BatchConfig", "OverlapKnobs", "ParallelConfig", "config_problems", "validate",
           "MemoryEstimate", "estimate_memory", "layer_activation_bytes", "StepGraph", "build_step"]
