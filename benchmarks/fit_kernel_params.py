"""Fit the compute cost parameters per GPU on the kernel corpus's ``fit`` half (repeatable).

Prints, per GPU with data, the values that :mod:`ccoverlap.cost.params` ships as that GPU's
defaults (``_GPU_OVERRIDES``); the other half judges them (``ccoverlap validate kernels``).

    python benchmarks/fit_kernel_params.py [--gpu H100-SXM] [--kind gemm]
"""

from __future__ import annotations

import argparse

from ccoverlap.validation.kernels import fit_params

GEMM = ["gemm_peak_fraction", "gemm_small_tile_efficiency", "gemm_tile_overhead_ksteps", "gemm_mem_overlap",
        "gemm_gemv_efficiency"]
#: Hopper's GEMMs are persistent kernels (docs/model.md "Kernels"): one more GEMM parameter there
PERSISTENT = ["gemm_persistent_overhead_fraction"]
HOPPER = ("H100-SXM", "H200")
#: the power limiter and the serial split-K fixup (docs/model.md "Kernels"), fitted where seen: H100 SXM
POWER = ["gemm_power_clock_fraction", "gemm_power_settle_s", "gemm_split_k_fixup_s"]
POWER_GPUS = ("H100-SXM",)
MEMORY = ["mem_rowwise_efficiency", "mem_rowwise_latency_s", "mem_rowwise_blocks_per_sm", "mem_l2_capacity_fraction",
          "mem_l2_bandwidth_ratio"]
ATTENTION = ["attention_tile_overhead_iters", "attention_causal_efficiency"]
GPUS = {"gemm": ["H100-SXM", "H200", "A100-80GB-SXM", "A40"], "memory": ["H100-SXM", "A100-80GB-SXM", "A40"],
        "attention": ["H100-SXM"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="append")
    ap.add_argument("--kind", action="append", choices=("gemm", "memory", "attention"))
    args = ap.parse_args()
    for kind in args.kind or ["gemm", "memory", "attention"]:
        for gpu in args.gpu or GPUS[kind]:
            gemm = GEMM + (PERSISTENT if gpu in HOPPER else []) + (POWER if gpu in POWER_GPUS else [])
            names = {"gemm": gemm, "memory": MEMORY, "attention": ATTENTION}[kind]
            vals = fit_params(gpu, kind, names)
            print(f"{kind} {gpu}: " + ", ".join(f"{k}={v:.4g}" for k, v in vals.items()), flush=True)


if __name__ == "__main__":
    main()
