"""Fit the compute cost parameters per GPU on the kernel corpus's ``fit`` half (repeatable).

Prints, per GPU with data, the values that :mod:`ccoverlap.cost.params` ships as that GPU's
defaults (``_GPU_OVERRIDES``); the other half judges them (``ccoverlap validate kernels``).

    python benchmarks/fit_kernel_params.py [--gpu H100-SXM] [--kind gemm]
"""

from __future__ import annotations

import argparse

from ccoverlap.catalog.hardware import get_gpu
from ccoverlap.validation.kernels import fit_params, kernel_params

GEMM = ["gemm_peak_fraction", "gemm_small_tile_efficiency", "gemm_tile_overhead_ksteps", "gemm_mem_overlap",
        "gemm_gemv_efficiency"]
#: Hopper's GEMMs are persistent kernels (docs/model.md "Kernels"): one more GEMM parameter there
PERSISTENT = ["gemm_persistent_overhead_fraction"]
HOPPER = ("H100-SXM", "H200")
#: the power limiter and the serial split-K fixup (docs/model.md "Kernels"), fitted where seen
POWER = ["gemm_power_clock_fraction", "gemm_power_settle_s", "gemm_split_k_fixup_s"]
#: the GEMM fields fitted per GPU, where not GEMM (+ PERSISTENT on Hopper): H100 SXM fits every
#: GEMM field with the limiter; the A100 the peak with it, its other GEMM fields kept (refitted,
#: they move the nccl-1428 contention row that l2_pollution_penalty is fitted on: params.py [SPLITK])
GEMM_FIELDS = {"H100-SXM": GEMM + PERSISTENT + POWER, "A100-80GB-SXM": ["gemm_peak_fraction"] + POWER}
#: where the limiter is off (clock fraction 1, time constant and fixup 0) the fit starts from these
#: (the H100 SXM's scale): from the off values Nelder-Mead leaves the time constant and the fixup at
#: ~0 and the limiter's clock acts as a lower peak (A100 fit half: 5.6% median |error| either way)
POWER_SEED = {"gemm_power_clock_fraction": 0.9, "gemm_power_settle_s": 1.4e-4, "gemm_split_k_fixup_s": 4.5e-7}
MEMORY = ["mem_rowwise_efficiency", "mem_rowwise_latency_s", "mem_rowwise_blocks_per_sm", "mem_l2_capacity_fraction",
          "mem_l2_bandwidth_ratio"]
ATTENTION = ["attention_tile_overhead_iters", "attention_causal_efficiency"]
GPUS = {"gemm": ["H100-SXM", "H200", "A100-80GB-SXM", "A40"], "memory": ["H100-SXM", "A100-80GB-SXM", "A40"],
        "attention": ["H100-SXM"]}


def _seeds(gpu: str, names: list[str]) -> dict[str, float]:
    """:data:`POWER_SEED` where ``names`` fit the limiter and the GPU's defaults have it off."""
    p = kernel_params(get_gpu(gpu))
    off = p.gemm_power_clock_fraction >= 1.0 or p.gemm_power_settle_s <= 0 or p.gemm_split_k_fixup_s <= 0
    return {n: v for n, v in POWER_SEED.items() if n in names} if off else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="append")
    ap.add_argument("--kind", action="append", choices=("gemm", "memory", "attention"))
    args = ap.parse_args()
    for kind in args.kind or ["gemm", "memory", "attention"]:
        for gpu in args.gpu or GPUS[kind]:
            gemm = GEMM_FIELDS.get(gpu, GEMM + (PERSISTENT if gpu in HOPPER else []))
            names = {"gemm": gemm, "memory": MEMORY, "attention": ATTENTION}[kind]
            vals = fit_params(gpu, kind, names, start=_seeds(gpu, names))
            print(f"{kind} {gpu}: " + ", ".join(f"{k}={v:.4g}" for k, v in vals.items()), flush=True)


if __name__ == "__main__":
    main()
