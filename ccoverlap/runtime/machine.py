"""Peak compute and memory bandwidth of the device an op runs on (inputs to FiCCO §V-C).

A small table keyed by a substring of ``torch.cuda.get_device_name()``, built from the
hardware catalog (:data:`ccoverlap.catalog.hardware.GPUS`, dense datasheet figures with sources). CPUs get conservative defaults, because the
heuristic only needs an order of magnitude and a CPU's real peak depends on cores, SIMD
width and clocks that torch does not report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ccoverlap.catalog.hardware import GPUS

__all__ = ["MachineSpec", "GPU_TABLE", "CPU_DEFAULT", "machine_for"]


@dataclass(frozen=True, kw_only=True)
class MachineSpec:
    """Peak dense throughput per dtype (flop/s) and memory bandwidth (byte/s) of one device."""

    name: str
    peak_flops_bf16: float
    peak_flops_tf32: float
    peak_flops_fp32: float
    mem_bw_bytes_per_s: float
    source: str
    #: bytes/s one device receives from its peers in a collective (per direction); None: unknown
    #: (then ``auto`` has no "overlap cannot help" step)
    link_bw_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        for f in ("peak_flops_bf16", "peak_flops_tf32", "peak_flops_fp32", "mem_bw_bytes_per_s"):
            if getattr(self, f) <= 0:
                raise ValueError(f"MachineSpec {self.name}: {f} must be positive")

    def peak_flops(self, dtype: torch.dtype) -> float:
        """Peak flop/s for GEMMs in ``dtype`` (fp32 uses TF32 when torch allows it)."""
        if dtype in (torch.bfloat16, torch.float16):
            return self.peak_flops_bf16
        if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
            return self.peak_flops_tf32
        return self.peak_flops_fp32


def _from_catalog(catalog_name: str, link_bw_bytes_per_s: float | None = None) -> MachineSpec:
    """A MachineSpec from the hardware catalog (one source of truth for datasheet numbers).
    Dense TF32 is half of dense BF16 on Ampere, Hopper and CDNA 3 (same datasheets)."""
    gpu = GPUS[catalog_name]
    return MachineSpec(name=gpu.name, peak_flops_bf16=gpu.peak_flops["bf16"],
                       peak_flops_tf32=gpu.peak_flops["bf16"] / 2, peak_flops_fp32=gpu.peak_flops["fp32"],
                       mem_bw_bytes_per_s=gpu.hbm_bytes_per_s, source=gpu.source,
                       link_bw_bytes_per_s=link_bw_bytes_per_s)


# Ordered: the first key contained in the device name wins (so "H100 PCIe" before "H100").
GPU_TABLE: dict[str, MachineSpec] = {
    # link bandwidths per direction: NVLink 4 (H100/H200) 450 GB/s, NVLink 3 (A100) 300 GB/s,
    # PCIe Gen4/Gen5 x16 32/64 GB/s, MI300X 7 Infinity Fabric links x 64 GB/s (FiCCO §III)
    "H200": _from_catalog("H200", 450e9),
    # not in the cluster catalog (no PCIe H100 cluster there), so its numbers live here
    "H100 PCIe": MachineSpec(
        name="NVIDIA H100 PCIe", peak_flops_bf16=756e12, peak_flops_tf32=378e12,
        peak_flops_fp32=51e12, mem_bw_bytes_per_s=2.0e12, link_bw_bytes_per_s=64e9,
        source="NVIDIA H100 Tensor Core GPU datasheet, PCIe column (dense)",
    ),
    "H100": _from_catalog("H100-SXM", 450e9),
    "A100": _from_catalog("A100-80GB-SXM", 300e9),
    "A40": _from_catalog("A40", 32e9),
    "MI300X": _from_catalog("MI300X", 7 * 64e9),
}  # fmt: skip

#: Conservative CPU defaults (an assumption, not a measurement): about 100 GFLOP/s and
#: 20 GB/s, the order of a few AVX2 cores and one DDR4 channel pair. The link: gloo over loopback
#: TCP, 0.5 GB/s received per rank - the order measured without any GEMM by
#: benchmarks/bench_runtime_gloo_chunks.py (0.27 GB/s under load for a whole 32 MB all-gather).
CPU_DEFAULT = MachineSpec(
    name="CPU (conservative defaults)", peak_flops_bf16=1e11, peak_flops_tf32=1e11,
    peak_flops_fp32=1e11, mem_bw_bytes_per_s=2e10, link_bw_bytes_per_s=5e8,
    source="assumed; override with machine_for(..., spec=MachineSpec(...))",
)  # fmt: skip

#: Used for a CUDA device that is not in the table: H100-class numbers, said in the reason.
UNKNOWN_GPU = GPU_TABLE["H100"]


def machine_for(device: torch.device) -> MachineSpec:
    """The :class:`MachineSpec` for ``device`` (table lookup on CUDA, defaults on CPU)."""
    if device.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(device)
        for key, spec in GPU_TABLE.items():
            if key.lower() in name.lower():
                return spec
        return UNKNOWN_GPU
    return CPU_DEFAULT
