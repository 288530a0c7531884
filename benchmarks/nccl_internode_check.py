"""ccoverlap's alpha-beta NCCL model on a DGX H100 cluster next to published nccl-tests figures.

Prints, for the process-group shapes the published Megatron-Core / Llama 3 runs use, the time
and bus bandwidth (nccl-tests' definition) the cost model gives a collective alone, with the
algorithm and protocol it picks. Published reference points (not re-measured here):

* 46-48 GB/s busbw per NDR 400G NIC (NVIDIA, NVIDIA/nccl-tests#290, AddyLaddy 2025-03-03):
  the ceiling for a group with one GPU per node (the DP group of a TP 8 layout);
* ~470 GB/s all-reduce busbw expected on 2 nodes x 8 H100 with 8 x 400G (NVIDIA/nccl#2409,
  citing nccl-tests#309): NVLS / SHARP-class in-network reduction, which this model does not
  have (it gives ~370, the ring / tree ceiling); all-gather and reduce-scatter do not use it
  for groups with one GPU per node.

    .venv/bin/python benchmarks/nccl_internode_check.py [--bytes 1e9]
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    """Print the table (Markdown); returns the exit status."""
    from ccoverlap.catalog.hardware import get_cluster
    from ccoverlap.cost.comm import bus_bandwidth, collective_profile
    from ccoverlap.cost.params import default_params
    from ccoverlap.specs import CollectiveSpec, GroupSpec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=float, default=1e9, help="message size as nccl-tests' size (default 1 GB)")
    args = ap.parse_args(argv)
    m = args.bytes
    cases = [
        ("all_reduce", 16, 8, "2 nodes x 8 GPUs"),
        ("all_reduce", 384, 8, "48 nodes x 8 GPUs"),
        ("reduce_scatter", 48, 1, "DP group of TP 8 (1 GPU per node, 48 nodes)"),
        ("all_gather", 48, 1, "DP group of TP 8 (1 GPU per node, 48 nodes)"),
        ("reduce_scatter", 48, 2, "DP group of TP 4 (2 GPUs per node, 24 nodes)"),
        ("reduce_scatter", 48, 4, "DP group of TP 2 (4 GPUs per node, 12 nodes)"),
        ("reduce_scatter", 48, 8, "DP group of TP 1 (8 GPUs per node, 6 nodes)"),
    ]
    print(f"# ccoverlap cost model, DGX H100 (NVSwitch, 8 x 400G IB per node), message {m:.3g} B, collective alone")
    print("| collective | group | ranks | per node | algorithm | protocol | time (ms) | busbw (GB/s) |")
    print("| :-- | :-- | --: | --: | :-- | :-- | --: | --: |")
    for coll, n, local, what in cases:
        cluster = get_cluster("dgx-h100", nodes=max(1, n // local))
        params = default_params(cluster.gpu)
        prof = collective_profile(CollectiveSpec(collective=coll, bytes=m, group=GroupSpec(name="dp", size=n, local_size=local)),
                                  cluster, params)
        bw = bus_bandwidth(coll, m, n, prof.time_s) / 1e9
        print(f"| {coll} | {what} | {n} | {local} | {prof.algorithm} | {prof.config.protocol} | "
              f"{prof.time_s * 1e3:.2f} | {bw:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
