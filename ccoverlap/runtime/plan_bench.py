"""Plan-level benchmark: torchtitan's TP + SP plan with torch's styles vs ccoverlap's, side by side.

One plan dict (:mod:`ccoverlap.runtime.llama`) is applied with ``parallelize_module`` once
with torch's ``ColwiseParallel``/``RowwiseParallel``/``PrepareModuleInput`` and once with
:mod:`ccoverlap.runtime.tp`'s; both start from the same full weights. Two workloads:

* ``block``: one :class:`~ccoverlap.runtime.llama.Block`, forward + backward of a
  sequence-sharded ``[b, s/P, dim]`` input with a fixed upstream gradient;
* ``model``: :class:`~ccoverlap.runtime.llama.Llama` (embedding, ``layers`` blocks, norm,
  head) with loss parallelism (``loss_parallel()``, vocab-sharded logits), forward,
  backward and an AdamW step.

Timing: after warm-up, ``reps`` repetitions, each running every row once in a Williams
order (every row first, and right after every other row, equally often), a barrier before
each timed call; a call's time is the slowest rank's (all-reduce MAX). Reported: the median
per row and, per row, the median over repetitions of (its time / torch's time in the same
repetition) with a sign-test interval (:func:`~ccoverlap.runtime.tuning.median_ratio_interval`):
load that changes between repetitions cancels in the paired ratio. Each step's CPU time
(``time.process_time``, every thread of the rank's process; the larger rank's) is kept too:
on a loaded machine it says whether two rows did different amounts of work. On CUDA with NCCL a third
row runs torch's styles under ``torch.compile`` with PyTorch's async TP (micro-pipeline TP on
symmetric memory) where this torch build has it; on CPU that row is skipped with the reason.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ccoverlap.errors import ConfigError
from ccoverlap.runtime import comm
from ccoverlap.runtime.llama import Block, Llama, block_plan, model_plan
from ccoverlap.runtime.tuning import median_ratio_interval, round_order

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["SHAPES", "PlanShape", "PlanBenchConfig", "run_rank", "bench", "format_table"]


@dataclass(frozen=True)
class PlanShape:
    """A block shape: batch ``b``, sequence ``s`` (whole, before sharding), ``dim``, heads, SwiGLU hidden."""

    b: int
    s: int
    dim: int
    heads: int
    ffn: int

    def describe(self) -> str:
        """``b=.. s=.. h=.. heads=.. ffn=..``."""
        return f"b={self.b} s={self.s} h={self.dim} heads={self.heads} ffn={self.ffn}"


#: The three shapes of the plan benchmark: where attention, the GEMMs or the activation traffic weigh most.
SHAPES: dict[str, PlanShape] = {
    "attention-heavy": PlanShape(b=8, s=1024, dim=64, heads=4, ffn=256),
    "gemm-heavy": PlanShape(b=2, s=512, dim=1024, heads=16, ffn=4096),
    "activation-heavy": PlanShape(b=64, s=128, dim=128, heads=8, ffn=128),
}


@dataclass
class PlanBenchConfig:
    """What to time: a shape, ``block`` or ``model``, repetitions and the ccoverlap style arguments."""

    shape: str = "activation-heavy"
    workload: str = "block"
    reps: int = 20
    warmup: int = 2
    layers: int = 4
    vocab: int = 1024
    dtype: str = "float32"
    schedule: str = "auto"
    rows: tuple[str, ...] = ("torch", "ccoverlap")
    seed: int = 0
    dims: PlanShape | None = None  # overrides the named shape (tests use small ones)

    def validate(self, world: int) -> PlanShape:
        """The :class:`PlanShape`; raises :class:`ConfigError` on an unknown name or a shape the ranks cannot split."""
        if self.dims is None and self.shape not in SHAPES:
            raise ConfigError(f"unknown plan shape {self.shape!r}; choose from {', '.join(SHAPES)}")
        if self.workload not in ("block", "model"):
            raise ConfigError(f"workload must be 'block' or 'model', got {self.workload!r}")
        if self.reps < 1 or self.warmup < 0 or self.layers < 1:
            raise ConfigError("reps and layers must be >= 1, warmup >= 0")
        sh = self.dims or SHAPES[self.shape]
        for name, value in (("s", sh.s), ("heads", sh.heads), ("ffn", sh.ffn), ("vocab", self.vocab)):
            if value % world:
                raise ConfigError(f"{self.shape}: {name}={value} does not split over {world} ranks")
        return sh


def _build(
    cfg: PlanBenchConfig, sh: PlanShape, row: str, mesh: DeviceMesh, full_state: Mapping[str, torch.Tensor]
) -> nn.Module:
    """The workload parallelized for ``row``: ``torch``, ``ccoverlap`` or ``ccoverlap:<schedule>``."""
    from torch.distributed.tensor.parallel import parallelize_module

    from ccoverlap.runtime.tp import load_full_state_dict

    torch.manual_seed(cfg.seed + 1)
    styles, _, sched = row.partition(":")
    kw = {"schedule": sched or cfg.schedule} if styles == "ccoverlap" else {}
    mod: nn.Module
    if cfg.workload == "block":
        mod = Block(sh.dim, sh.heads, sh.ffn)
        plan = block_plan(styles, **kw)
    else:
        model = Llama(cfg.vocab, sh.dim, sh.heads, sh.ffn, cfg.layers)
        mod, plan = model, model_plan(model, styles, loss_parallel=True, **kw)
    mod = mod.to(getattr(torch, cfg.dtype))
    if mesh.device_type == "cuda":
        mod = mod.cuda()
    parallelize_module(mod, mesh, plan)
    load_full_state_dict(mod, full_state)
    return mod


def _reference_state(cfg: PlanBenchConfig, sh: PlanShape) -> dict[str, torch.Tensor]:
    torch.manual_seed(cfg.seed)
    mod = Block(sh.dim, sh.heads, sh.ffn) if cfg.workload == "block" else Llama(
        cfg.vocab, sh.dim, sh.heads, sh.ffn, cfg.layers)  # fmt: skip
    return {k: v.to(getattr(torch, cfg.dtype)) for k, v in mod.state_dict().items()}


def _step_fn(
    cfg: PlanBenchConfig, sh: PlanShape, mod: nn.Module, rank: int, world: int, device: torch.device
) -> tuple[Callable[[], None], Callable[[], float]]:
    """``(step, value)``: ``step()`` runs one timed step on this rank; ``value()`` reads a number of the last
    step to compare rows by (the input gradient's size for a block, the loss for the model), outside the timing."""
    dt = getattr(torch, cfg.dtype)
    g = torch.Generator().manual_seed(cfg.seed + 100)
    if cfg.workload == "block":
        per = sh.s // world
        x_full = torch.randn(sh.b, sh.s, sh.dim, generator=g).to(device=device, dtype=dt)
        dy_full = torch.randn(sh.b, sh.s, sh.dim, generator=g).to(device=device, dtype=dt)
        x = x_full[:, rank * per : (rank + 1) * per].contiguous().requires_grad_()
        dy = dy_full[:, rank * per : (rank + 1) * per].contiguous()

        def step() -> None:
            x.grad = None
            mod.zero_grad(set_to_none=True)
            y = mod(x)
            y = y.to_local() if hasattr(y, "to_local") else y
            y.backward(dy)

        def grad_size() -> float:
            assert x.grad is not None  # read after a step
            return float(x.grad.double().abs().sum())

        return step, grad_size
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    tokens = torch.randint(0, cfg.vocab, (sh.b, sh.s + 1), generator=g).to(device)
    inp, tgt = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-3)
    last: list[torch.Tensor | None] = [None]

    def model_step() -> None:
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            pred = mod(inp)
            loss = F.cross_entropy(pred.flatten(0, 1), tgt.flatten(0, 1))
            loss.backward()
        opt.step()
        last[0] = loss.detach()

    def loss_value() -> float:
        v = last[0]
        assert v is not None  # read after a step
        return float(v.full_tensor() if isinstance(v, DTensor) else v)

    return model_step, loss_value


def _async_tp_row(
    cfg: PlanBenchConfig, sh: PlanShape, mesh: DeviceMesh, full_state: Mapping[str, torch.Tensor]
) -> tuple[nn.Module | None, str | None]:
    """torch's styles compiled with PyTorch's async TP (symmetric memory), or ``(None, reason)``."""
    if mesh.device_type != "cuda":
        return None, "needs CUDA and NCCL"
    try:
        import torch._inductor.config as inductor_config
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
    except ImportError as exc:
        return None, f"this torch has no async TP ({exc})"
    try:
        enable_symm_mem_for_group(mesh.get_group().group_name)
        inductor_config._micro_pipeline_tp = True
        mod = _build(cfg, sh, "torch", mesh, full_state)
        return cast(nn.Module, torch.compile(mod)), None  # compiling a module gives a module (OptimizedModule)
    except Exception as exc:  # noqa: BLE001 - the reason is reported in the table
        return None, f"async TP unavailable: {type(exc).__name__}: {exc}"


def run_rank(rank: int, world: int, cfg: PlanBenchConfig) -> dict[str, Any] | None:
    """Time every row of ``cfg`` on this rank (collective); the result dict on rank 0, None elsewhere."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    sh = cfg.validate(world)
    backend = comm.backend_of()
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    mesh = init_device_mesh(device.type, (world,))
    full_state = _reference_state(cfg, sh)
    mods: dict[str, nn.Module] = {}
    skipped: dict[str, str | None] = {}
    for row in cfg.rows:
        if row == "async-tp":
            mod, why = _async_tp_row(cfg, sh, mesh, full_state)
            if mod is None:
                skipped[row] = why
                continue
            mods[row] = mod
        else:
            mods[row] = _build(cfg, sh, row, mesh, full_state)
    rows = list(mods)
    steps: dict[str, Callable[[], None]] = {}
    first: dict[str, float] = {}
    for r in rows:  # one untimed step each; its value compares the rows
        steps[r], value = _step_fn(cfg, sh, mods[r], rank, world, device)
        steps[r]()
        first[r] = value()
    for _ in range(cfg.warmup):
        for r in rows:
            steps[r]()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    times: dict[str, list[float]] = {r: [] for r in rows}
    cpu: dict[str, list[float]] = {r: [] for r in rows}
    for i in range(cfg.reps):
        for j in round_order(len(rows), i):
            r = rows[j]
            sync()
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            steps[r]()
            sync()
            times[r].append(time.perf_counter() - t0)
            cpu[r].append(time.process_time() - c0)
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t = torch.tensor([times[r] + cpu[r] for r in rows], dtype=torch.float64, device=comm.comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    both = t.cpu().tolist()
    slowest = {r: v[: cfg.reps] for r, v in zip(rows, both)}
    cpu_max = {r: v[cfg.reps :] for r, v in zip(rows, both)}
    if rank != 0:
        return None
    return _result(cfg, sh, world, backend, device, rows, slowest, cpu_max, first, skipped, (load0, load1))


def _result(
    cfg: PlanBenchConfig, sh: PlanShape, world: int, backend: str, device: torch.device, rows: Sequence[str],
    slowest: Mapping[str, list[float]], cpu_max: Mapping[str, list[float]], first: Mapping[str, float],
    skipped: Mapping[str, str | None], load: tuple[float | None, float | None],
) -> dict[str, Any]:  # the --json result
    base = slowest.get("torch")
    out_rows: list[dict[str, Any]] = []
    for r in rows:
        row = {"row": r, "median_s": statistics.median(slowest[r]), "min_s": min(slowest[r]), "times_s": slowest[r],
               "cpu_median_s": statistics.median(cpu_max[r]), "first_step_value": first[r]}  # fmt: skip
        if base is not None and r != "torch":
            row["ratio_vs_torch"] = statistics.median(a / b for a, b in zip(slowest[r], base) if b > 0)
            row["ratio_interval_95"] = median_ratio_interval(slowest[r], base, 0.95)
        out_rows.append(row)
    from ccoverlap.runtime.tuning import tuning_cache

    auto = sorted({f"{k[0]} {list(k[2])}x{list(k[3])}: {d.schedule}" for k, d in tuning_cache().items()
                   if d.how == "auto"})  # fmt: skip
    return {
        "config": asdict(cfg), "shape": asdict(sh), "world_size": world, "backend": backend,
        "auto_decisions": auto,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "torch": torch.__version__, "threads_per_rank": torch.get_num_threads() if device.type == "cpu" else None,
        "rows": out_rows, "skipped_rows": skipped, "loadavg_1m_before_after": list(load),
    }  # fmt: skip


def bench(cfg: PlanBenchConfig, nproc: int, *, backend: str | None = None, threads: int | None = 1,
          timeout_s: float = 3600.0) -> dict[str, Any]:
    """Spawn ``nproc`` local ranks and run :func:`run_rank`; returns rank 0's result."""
    from ccoverlap.runtime.launch import spawn

    cfg.validate(nproc)
    res = spawn(run_rank, nproc, (cfg,), backend=backend, timeout_s=timeout_s, threads=threads)[0]
    assert res is not None  # rank 0 returns the result
    return res


def format_table(results: Sequence[Mapping[str, Any]], markdown: bool = False) -> str:
    """One line per (shape, workload, ranks, row): median ms, median CPU ms, paired ratio vs torch, its 95% interval.

    ``block`` is one block's forward + backward; ``model`` the whole model's forward +
    backward + AdamW step. Rows that could not run are listed under the table with the reason.
    """
    head = ["shape", "what", "P", "row", "median ms", "cpu ms", "vs torch", "95% CI"]
    lines: list[list[str]] = []
    notes: list[str] = []
    for res in results:
        cfg = res["config"]
        what = cfg["workload"]
        for row in res["rows"]:
            ratio, iv = row.get("ratio_vs_torch"), row.get("ratio_interval_95")
            cpu = row.get("cpu_median_s")
            lines.append([cfg["shape"], what, str(res["world_size"]), row["row"], f"{row['median_s'] * 1e3:.1f}",
                          f"{cpu * 1e3:.1f}" if cpu is not None else "-",
                          "1" if row["row"] == "torch" else (f"{ratio:.3f}" if ratio is not None else "-"),
                          f"{iv[0]:.2f}-{iv[1]:.2f}" if iv and iv[1] != float("inf") else "-"])  # fmt: skip
        for name, why in res.get("skipped_rows", {}).items():
            notes.append(f"{cfg['shape']} {what} P={res['world_size']}: {name} not run ({why})")
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(ln) + " |" for ln in lines]
    else:
        widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*ln) for ln in lines)]
    return "\n".join(out + notes)
