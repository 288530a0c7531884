"""The README.md of an ``--emit`` directory: what each file is and how to launch with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ccoverlap.predict.evaluate import StrategyResult

    from .applicable import EmitBundle

#: why the knobs stock NCCL cannot take per communication stay out of reach
LIMITS = (
    "Threads per block (NT) and the chunk size (C) are per process in stock NCCL "
    "(`NCCL_NTHREADS`, `NCCL_LL128_NTHREADS`, `NCCL_BUFFSIZE`, read once per process); the tuner "
    "plugin's CSV has no column for them. Where communications want different values, "
    "`nccl.env` carries the value with the most communication time and the others run with it.",
    "The tuner CSV tells communicators apart only by their node and rank counts: two process "
    "groups of the same shape with a call of the same size get the same row.",
    "Channels per call come from the CSV; a communicator never runs more channels than it "
    "has, so groups whose channels change also get min / max CTAs (`process_groups.json`).",
    "All-to-all runs on NCCL's send/receive path, which the tuner plugin is not asked about: "
    "only its group's min / max CTAs reach it.",
    "Algorithms NCCL does not have (hierarchical intra-/inter-node collectives) and rewrites of "
    "the step (partitioned collectives, reordered backward, micro-batches launched together) "
    "have no setting in NCCL or the frameworks.",
)


def _ms(res: StrategyResult | None) -> str:
    return f"{res.step_time_s * 1e3:.1f} ms" if res is not None else "-"


def _files(b: EmitBundle, written: dict[str, str]) -> list[str]:
    lines = ["## Files", ""]
    desc = {
        "nccl.env": "process-wide `NCCL_*` variables (`NAME=value`; only values every communication shares, "
                    "or the one with the most communication time where they differ)",
        "nccl_tuner.csv": "per-call algorithm, protocol and channels for NCCL's example tuner plugin "
                          "(`collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,"
                          "numPipeOps,regBuff`, bytes inclusive, one row per communication of the step)",
        "process_groups.json": "min / max CTAs (channels) per process group, for "
                               "`ProcessGroupNCCL.Options().config` (NCCL >= 2.17)",
        "megatron_nccl.yaml": "the same per Megatron-LM process group, for `--nccl-communicator-config-path`",
        "framework.json": "framework settings for the knobs the strategy changes (FSDP2 / DDP keywords, "
                          "torchtitan keys, Megatron-LM arguments) and the TP plan for ccoverlap's ParallelStyles",
        "torchtitan.toml": "the torchtitan job-config keys to add",
        "megatron_args.txt": "the Megatron-LM arguments to add",
    }
    for name in written:
        if name in desc:
            lines.append(f"* `{name}`: {desc[name]}.")
    lines += ["* `decision.json`: all of it with the decision behind it: per communication the configuration "
              "wanted, as given and applied; every change and whether it applies.", ""]
    return lines


def _launch(b: EmitBundle, written: dict[str, str]) -> list[str]:
    lines = ["## Launch", ""]
    lines.append("* Export the NCCL variables on every node before the job starts (NCCL reads them once "
                 "per process): `set -a; . ./nccl.env; set +a`, then `torchrun ...`. In Python, "
                 "`ccoverlap.runtime.nccl.apply_nccl_env(DIR)` does the same before the first "
                 "process group is created.")
    if "nccl_tuner.csv" in written:
        lines.append("* Build NCCL's example tuner plugin from the NCCL source of the version you run "
                     "(`plugins/tuner/example`, `ext-tuner/example` in releases before it moved; the CSV "
                     "format is there since NCCL 2.28) with `make`, and set "
                     "`NCCL_TUNER_PLUGIN=/absolute/path/libnccl-tuner-example.so`. `nccl.env` already "
                     "points `NCCL_TUNER_CONFIG_FILE` at this directory's CSV; keep the path if you move "
                     "the directory. The plugin gives a call no row matches one channel, so keep a row "
                     "for every collective you care about.")
    if "process_groups.json" in written:
        lines += ["* Pass the per-group options where the process groups are made:",
                  "   ```python",
                  "   from ccoverlap.runtime.nccl import process_group_options, device_mesh_backend_override",
                  "   dist.init_process_group(\"nccl\", pg_options=process_group_options(DIR, \"dp\"))",
                  "   tp = dist.new_group(ranks, pg_options=process_group_options(DIR, \"tp\"))",
                  "   mesh = init_device_mesh(\"cuda\", (dp, tp), mesh_dim_names=(\"dp\", \"tp\"),",
                  "                           backend_override=device_mesh_backend_override(DIR, (\"dp\", \"tp\")))",
                  "   ```",
                  "   Megatron-LM reads them from `--nccl-communicator-config-path megatron_nccl.yaml` "
                  "(in `megatron_args.txt`)."]
    if b.framework is None:
        return lines + [""]
    lines += ["* Framework settings (`framework.json`):",
              "   * PyTorch FSDP2: `fully_shard(block, mesh=..., **ccoverlap.runtime.settings.fully_shard_kwargs(DIR))` "
              "on each block, then `ccoverlap.runtime.settings.apply_fsdp_prefetch(DIR, blocks)`; DDP: "
              "`DistributedDataParallel(model, **ccoverlap.runtime.settings.ddp_kwargs(DIR))`.",
              "   * torchtitan: add the keys of `torchtitan.toml` to the job's TOML, or set the same names "
              "(`config.parallelism....`, `config.compile....`) in its Python configuration.",
              "   * Megatron-LM: append `megatron_args.txt` to the training command."]
    if b.framework.tp_plan:
        lines += ["* Tensor parallelism: `parallelize_module(model, mesh[\"tp\"], "
                  "ccoverlap.runtime.settings.tp_plan(DIR))` builds ccoverlap's overlapped ParallelStyles from "
                  "`framework.json`'s `tp_plan` (module names as in torchtitan's Llama: rename the keys for "
                  "another model)."]
    return lines + [""]


def readme_text(b: EmitBundle, written: dict[str, str], *, as_given: StrategyResult | None = None, command: str = "ccoverlap plan --emit") -> str:
    """The README.md text for bundle ``b`` and the files ``written``."""
    what = "NCCL settings" if b.framework is None else "NCCL and framework settings"
    by = "stock NCCL" if b.framework is None else f"{b.target} and stock NCCL"
    lines = [f"# {what} for '{b.strategy}'", "", f"Written by `{command}` for {b.description}."]
    if b.ideal is not None or b.applicable is not None:
        lines[-1] += (f" Predicted step time: as given {_ms(as_given)}, '{b.strategy}' {_ms(b.ideal)}, with only "
                      f"what {b.target} and stock NCCL can set ('applicable') {_ms(b.applicable)}.")
    lines.append("")
    lines += _files(b, written)
    lines += _launch(b, written)
    lines += ["## What is not applied", ""]
    dropped = b.dropped_lines()
    if dropped:
        lines.append(f"These changes of '{b.strategy}' cannot be set with {by}; they run as the settings "
                     f"give them (the `applicable` prediction does the same):")
        lines += [f"* {x}" for x in dropped[:40]]
        if len(dropped) > 40:
            lines.append(f"* ... {len(dropped) - 40} more in `decision.json`")
    else:
        lines.append(f"Everything '{b.strategy}' changes can be set with {by}.")
    lines += ["", "Why some knobs are out of reach of stock NCCL:", ""] + [f"* {x}" for x in LIMITS] + [""]
    return "\n".join(lines)
