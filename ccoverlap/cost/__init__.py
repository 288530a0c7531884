"""Cost model: compute (roofline + waves), communication (alpha-beta with NCCL's knobs) and
their contention (lagom §3.2 eqs. 4–6, ficco §IV-C/§IV-D).

``CostModel(cluster, params).duration_s(spec, concurrent)`` is what the simulator calls; the
module-level functions are the closed forms and building blocks, each checkable on its own.
"""

from ccoverlap.cost.comm import (
                                 algorithm_bandwidth,
                                 bus_bandwidth,
                                 bus_bandwidth_factor,
                                 chain_broadcast_time_s,
                                 collective_profile,
                                 collective_time_s,
                                 copy_time_s,
                                 default_comm_config,
                                 default_p2p_config,
                                 effective_link_bandwidth,
                                 p2p_time_s,
                                 p2p_transfer_time_s,
                                 pairwise_all_to_all_time_s,
                                 ring_all_gather_time_s,
                                 ring_all_reduce_time_s,
                                 ring_reduce_scatter_time_s,
                                 tree_all_reduce_time_s,
)
from ccoverlap.cost.compute import (
                                 attention_time_s,
                                 gemm_profile,
                                 gemm_time_s,
                                 gemm_waves,
                                 memory_time_s,
                                 split_gemm,
                                 split_gemm_time_s,
)
from ccoverlap.cost.contention import comm_sms
from ccoverlap.cost.model import CostModel
from ccoverlap.cost.params import CostParams, default_params

__all__ = [
    "CostModel", "CostParams", "default_params",
    "gemm_time_s", "gemm_profile", "gemm_waves", "split_gemm", "split_gemm_time_s",
    "attention_time_s", "memory_time_s",
    "collective_time_s", "collective_profile", "p2p_time_s", "copy_time_s",
    "default_comm_config", "default_p2p_config", "effective_link_bandwidth",
    "bus_bandwidth_factor", "algorithm_bandwidth", "bus_bandwidth",
    "ring_all_reduce_time_s", "ring_all_gather_time_s", "ring_reduce_scatter_time_s",
    "tree_all_reduce_time_s", "pairwise_all_to_all_time_s", "chain_broadcast_time_s",
    "p2p_transfer_time_s", "comm_sms",
]
