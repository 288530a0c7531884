"""``ccoverlap bench``: time the overlapped ops of ccoverlap.runtime against the serial baseline.

For one GEMM shape it times every overlap schedule of an op (``serial``, ``ring``, the four
FiCCO schedules, ``auto``, ``tune``) on the live backend - NCCL on GPUs, gloo on CPU - and
prints, on rank 0, the median time per call (the slowest rank's time of each repetition,
after warm-up; every repetition runs each schedule once, in a Williams order - every
schedule first, and right after every other one, equally often - so that background load,
drift and what ran before hit all of them alike) and the speedup over ``serial``. ``--json`` prints one JSON object instead;
``--profile-dir DIR`` also writes a torch.profiler Chrome trace per rank
(``DIR/rank-<r>.json``, one profiler step per call) for ``ccoverlap analyze``.

Shapes: every rank runs an ``[M, K] x [K, N]`` GEMM. ``all_gather_matmul``: each rank holds
``M/P`` rows of the input and an ``[N, K]`` weight; ``matmul_reduce_scatter``: ``[M, K]``
input, ``[N, K]`` weight, ``M/P`` output rows per rank; ``all_to_all_matmul``: ``M`` tokens
per rank routed evenly to ``E`` experts per rank (``--experts``) with ``[N, K]`` weights.

Launch with torchrun (``torchrun --nproc-per-node 2 -m ccoverlap bench ...``). Without
torchrun (no ``RANK`` in the environment) the command starts ``--nproc`` local processes
itself (default 2) on 127.0.0.1.

``--plan block|model`` times a whole plan instead of one op: torchtitan's Llama TP + SP plan
applied with torch's styles and with ccoverlap's (:mod:`ccoverlap.runtime.plan_bench`), in
paired alternating repetitions, for the ``--shape`` given; on CUDA with NCCL a third row runs
PyTorch's async TP (symmetric memory) where the build has it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ccoverlap.commands.options import Subparsers, add_common, add_dtype
from ccoverlap.config import short
from ccoverlap.errors import ConfigError
from ccoverlap.outputs import check_out_dir

if TYPE_CHECKING:  # torch is imported when the command runs: `ccoverlap --help` needs no torch
    import torch
    import torch.profiler

    from ccoverlap.runtime.plan_bench import PlanBenchConfig
    from ccoverlap.runtime.tuning import Decision

OPS = ("all_gather_matmul", "matmul_reduce_scatter", "all_to_all_matmul")
_DTYPES = ("bfloat16", "float16", "float32")  # the overlapped ops run no fp8

#: the bench's settings (:func:`_config`), as the worker processes receive them
BenchConfig = dict[str, Any]
#: reference rows to time beside the schedules: name -> one call
Parts = dict[str, Callable[[], object]]
_Cfg = TypeVar("_Cfg")
_Res = TypeVar("_Res")


class OpCall(Protocol):
    """``call(schedule, check=None)``: one call of the op under test (and its backward with
    ``--backward``); ``check``: the cross-rank shape check policy, None for the default."""

    def __call__(self, sched: str, check: str | None = None, /) -> torch.Tensor: ...


def register(sub: Subparsers) -> None:
    """Add the ``bench`` parser to the CLI's subparsers."""
    p = sub.add_parser(
        "bench",
        help="time overlapped collective+GEMM schedules on torch.distributed (torchrun, or self-spawned)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--op", choices=OPS, default="all_gather_matmul", help="op to time (default all_gather_matmul)")
    p.add_argument("--m", type=int, default=4096, help="GEMM rows M after the all-gather / before the reduce-scatter; "
                   "tokens per rank for all_to_all_matmul (default 4096)")
    p.add_argument("--n", type=int, default=4096, help="GEMM output columns N per rank (default 4096)")
    p.add_argument("--k", type=int, default=4096, help="GEMM reduction dimension K (default 4096)")
    add_dtype(p, default=None, choices=_DTYPES, help_default="bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--schedules", default="all",
                   help="comma-separated schedules to time, 'serial' always included (default: all)")
    p.add_argument("--experts", type=int, default=1, help="experts per rank for all_to_all_matmul (default 1)")
    p.add_argument("--backward", action="store_true", help="time forward + backward instead of forward only")
    p.add_argument("--comm-engine", choices=("sm", "dma"), default="sm",
                   help="'sm': c10d kernels/threads (default); 'dma': CUDA copy engines for the all-gather")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per schedule (default 3)")
    p.add_argument("--iters", type=int, default=10, help="timed calls per schedule; the median is reported (default 10)")
    add_common(p)
    p.add_argument("--out", "--profile-dir", dest="profile_dir", metavar="DIR",
                   help="write a torch.profiler Chrome trace per rank: DIR/rank-<r>.json")
    p.add_argument("--profile-iters", type=int, default=2, help="profiled calls per schedule (default 2)")
    p.add_argument("--nproc", type=int, default=2, help="processes to start when not under torchrun (default 2)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per rank (default: CPU cores / local ranks, at least 1)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="process-group backend when this command creates it (default: NCCL with one GPU per rank, "
                        "else gloo)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--no-reference-rows", action="store_true",
                   help="time only the schedules (no comm-only, GEMM-only, check and baseline rows)")
    g = p.add_argument_group("plan benchmark (torchtitan's Llama TP+SP plan, torch's styles vs ccoverlap's)")
    g.add_argument("--plan", choices=("block", "model"), default=None,
                   help="time a Llama block (fwd+bwd) or a small Llama model (fwd+bwd+AdamW, loss parallel) "
                        "parallelized from one plan dict with torch's styles and with ccoverlap's")
    g.add_argument("--shape", default="activation-heavy",
                   help="plan shape(s), comma-separated: attention-heavy, gemm-heavy, activation-heavy, or all "
                        "(default activation-heavy)")
    g.add_argument("--reps", type=int, default=20, help="paired repetitions of the plan benchmark (default 20)")
    g.add_argument("--layers", type=int, default=4, help="blocks of the --plan model (default 4)")
    g.add_argument("--vocab", type=int, default=1024, help="vocabulary of the --plan model (default 1024)")
    g.add_argument("--schedule", default="auto", help="ccoverlap styles' schedule for --plan (default auto)")
    g.add_argument("--markdown", action="store_true", help="print the --plan table as Markdown")
    p.set_defaults(run=run)


def _config(args: argparse.Namespace, world: int) -> BenchConfig:
    check_out_dir(args.profile_dir, "--out")  # before the GPUs are started
    for name in ("m", "n", "k", "iters", "experts", "profile_iters"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    if args.op != "all_to_all_matmul" and args.m % world:
        raise ConfigError(f"--m {args.m} is not divisible by the {world} ranks (every rank holds M/P rows)")
    if args.op == "all_to_all_matmul" and args.m % (world * args.experts):
        raise ConfigError(f"--m {args.m} tokens do not split evenly over {world} ranks x {args.experts} experts")
    allowed = _allowed_schedules(args.op)
    if args.schedules == "all":
        scheds = list(allowed)
    else:
        scheds = [s.strip() for s in args.schedules.split(",") if s.strip()]
        bad = [s for s in scheds if s not in allowed]
        if bad:
            raise ConfigError(f"unknown schedule(s) {', '.join(bad)} for {args.op}; choose from {', '.join(allowed)}")
        if "serial" not in scheds:
            scheds.insert(0, "serial")
    return {
        "op": args.op, "m": args.m, "n": args.n, "k": args.k, "dtype": args.dtype, "schedules": scheds,
        "experts": args.experts, "backward": args.backward, "comm_engine": args.comm_engine,
        "warmup": args.warmup, "iters": args.iters, "profile_dir": args.profile_dir,
        "profile_iters": args.profile_iters, "threads": args.threads, "seed": args.seed,
        "reference_rows": not args.no_reference_rows,
    }  # fmt: skip


def _allowed_schedules(op: str) -> tuple[str, ...]:
    if op == "all_to_all_matmul":
        return ("serial", "chunked", "auto", "tune")
    return ("serial", "ring", "uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d", "uniform-fused-2d",
            "auto", "tune")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Entry point: bench under torchrun, or spawn ``--nproc`` local ranks and bench there."""
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
    except ImportError:
        raise ConfigError("bench needs torch (pip install 'ccoverlap[torch]')") from None
    if not dist.is_available():
        raise ConfigError("this torch build has no torch.distributed")
    if args.plan:
        return _run_plan(args)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        cfg = _config(args, world)
        result = _under_torchrun(_worker, cfg, args.backend)
    else:
        if args.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
        cfg = _config(args, args.nproc)
        from ccoverlap.runtime.launch import default_backend, spawn

        backend = default_backend(args.nproc) if args.backend == "auto" else args.backend
        if backend == "nccl" and torch.cuda.device_count() < args.nproc:
            raise ConfigError(f"--backend nccl needs {args.nproc} GPUs, found {torch.cuda.device_count()}")
        result = spawn(_worker, args.nproc, (cfg,), backend=backend, timeout_s=3600, threads=None)[0]
    if result is not None:
        _print(result, as_json=args.json)
    return 0


def _plan_configs(args: argparse.Namespace, world: int) -> list[PlanBenchConfig]:
    from ccoverlap.runtime.ops import ALL_SCHEDULES
    from ccoverlap.runtime.plan_bench import SHAPES, PlanBenchConfig

    names = list(SHAPES) if args.shape == "all" else [s.strip() for s in args.shape.split(",") if s.strip()]
    if args.schedule not in ALL_SCHEDULES:
        raise ConfigError(f"--schedule must be one of {', '.join(ALL_SCHEDULES)}; got {short(args.schedule)}")
    dtype = args.dtype or "float32"
    cfgs = [PlanBenchConfig(shape=n, workload=args.plan, reps=args.reps, warmup=args.warmup, layers=args.layers,
                            vocab=args.vocab, dtype=dtype, schedule=args.schedule, seed=args.seed,
                            rows=("torch", "ccoverlap", "async-tp")) for n in names]  # fmt: skip
    for c in cfgs:
        c.validate(world)
    return cfgs


def _run_plan(args: argparse.Namespace) -> int:
    """``--plan``: the plan-level benchmark (:mod:`ccoverlap.runtime.plan_bench`), one table for every shape."""
    from ccoverlap.runtime import plan_bench

    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.nproc
    if world < 1:
        raise ConfigError(f"--nproc must be >= 1, got {world}")
    cfgs = _plan_configs(args, world)
    results: list[dict[str, Any]] = []
    for cfg in cfgs:
        if under_torchrun:
            res = _under_torchrun(plan_bench.run_rank, cfg, args.backend)
        else:
            backend = None if args.backend == "auto" else args.backend
            res = plan_bench.bench(cfg, world, backend=backend, threads=args.threads or 1)
        if res is not None:
            results.append(res)
    if results:
        if args.json:
            json.dump(results, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            load = results[-1].get("loadavg_1m_before_after") or [None, None]
            print(f"plan benchmark: {results[0]['backend']} on {results[0]['device']}, {world} ranks")
            print(f"{cfgs[0].reps} paired repetitions, slowest rank per step"
                  + (f"; load average {load[0]:.1f} -> {load[1]:.1f}" if None not in load else ""))
            print("block: one block fwd+bwd; model: embedding, blocks, head, loss parallel, fwd+bwd+AdamW")
            print(plan_bench.format_table(results, markdown=args.markdown))
    return 0


def _under_torchrun(worker: Callable[[int, int, _Cfg], _Res], cfg: _Cfg, backend: str) -> _Res:
    """``worker(rank, world, cfg)`` in a job started by torchrun: the process group from its
    environment (``backend`` "auto": NCCL when every local rank has a GPU, else gloo), set up
    here unless the caller already has one, and torn down after."""
    import torch
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        if backend == "auto":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        created = True
    try:
        return worker(dist.get_rank(), dist.get_world_size(), cfg)
    finally:
        if created:
            dist.destroy_process_group()


def _worker(rank: int, world: int, cfg: BenchConfig) -> dict[str, Any] | None:
    """Bench on this rank (collective); returns the result dict on rank 0, None elsewhere."""
    import torch

    b = _setup_rank(rank, world, cfg)
    call, sync = _op_caller(b)
    parts, skipped = _reference_rows(b, call)
    ctx = torch.enable_grad() if b.grad else torch.no_grad()
    with ctx:
        _first_checked_call(b)
        scheds = list(cfg["schedules"]) + list(parts)
        slowest, loads = _time_schedules(b, scheds, parts, call, sync)
        rows = _result_rows(b, scheds, parts, slowest)
        if cfg["profile_dir"]:
            _profile(cfg, rank, call, sync, b.device)
    if rank != 0:
        return None
    return _rank0_result(b, rows, skipped, loads)


@dataclass
class _RankBench:
    """What the steps of one rank's bench share: the configuration, the device and the op's inputs."""

    rank: int
    world: int
    cfg: BenchConfig
    backend: str
    device: torch.device
    dtype: torch.dtype
    threads: int
    gen: torch.Generator  # of the random inputs
    x: Any = None  # torch.Tensor, set by _setup_rank once the shapes are known
    w: Any = None  # torch.Tensor, likewise
    splits: list[int] | None = None  # all_to_all_matmul's tokens per (rank, expert)

    @property
    def op(self) -> str:
        """The op under test."""
        return self.cfg["op"]

    @property
    def grad(self) -> bool:
        """Whether the bench times forward + backward."""
        return self.cfg["backward"]

    def rnd(self, *shape: int) -> torch.Tensor:
        """A random tensor of ``shape`` (unit-variance rows after the 1/sqrt(last dim) scale) on the device."""
        import torch

        return (torch.randn(*shape, generator=self.gen) / (shape[-1] ** 0.5)).to(device=self.device, dtype=self.dtype)


def _setup_rank(rank: int, world: int, cfg: BenchConfig) -> _RankBench:
    """This rank's device, threads, dtype and seeded inputs (x, w and the all-to-all splits)."""
    import torch

    from ccoverlap.runtime import comm

    backend = comm.backend_of()
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    threads = cfg["threads"] or max(1, (os.cpu_count() or 1) // max(1, local_world))
    if device.type == "cpu":
        torch.set_num_threads(threads)
    dtype = getattr(torch, cfg["dtype"] or ("bfloat16" if device.type == "cuda" else "float32"))
    g = torch.Generator(device="cpu").manual_seed(cfg["seed"] + rank)
    b = _RankBench(rank, world, cfg, backend, device, dtype, threads, g)
    m, n, k, e = cfg["m"], cfg["n"], cfg["k"], cfg["experts"]
    if b.op == "all_gather_matmul":
        b.x, b.w = b.rnd(m // world, k), b.rnd(n, k)
    elif b.op == "matmul_reduce_scatter":
        b.x, b.w = b.rnd(m, k), b.rnd(n, k)
    else:
        b.x, b.w = b.rnd(m, k), b.rnd(e, n, k)
        b.splits = [m // (world * e)] * (world * e)
    if b.grad:
        b.x.requires_grad_()
        b.w.requires_grad_()
    return b


def _op_caller(b: _RankBench) -> tuple[OpCall, Callable[[], None]]:
    """``call(schedule, check=None)``: one call of the op (and its backward with --backward); ``sync()``: wait for the GPU."""
    import torch

    from ccoverlap.runtime import all_gather_matmul, all_to_all_matmul, matmul_reduce_scatter

    cfg, op, grad, device = b.cfg, b.op, b.grad, b.device
    x, w, splits = b.x, b.w, b.splits
    dy = None

    def call(sched: str, check: str | None = None) -> torch.Tensor:
        if op == "all_gather_matmul":
            y = all_gather_matmul(x, w, schedule=sched, comm_engine=cfg["comm_engine"], check_shapes=check)
        elif op == "matmul_reduce_scatter":
            y = matmul_reduce_scatter(x, w, schedule=sched, comm_engine=cfg["comm_engine"], check_shapes=check)
        else:
            assert splits is not None  # _setup_rank splits the tokens for all_to_all_matmul
            y = all_to_all_matmul(x, w, splits, schedule=sched, check_shapes=check)
        if grad:
            nonlocal dy
            if dy is None or dy.shape != y.shape:
                dy = torch.ones_like(y)
            y.backward(dy)
        return y

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return call, sync


def _reference_rows(b: _RankBench, call: OpCall) -> tuple[Parts, dict[str, str]]:
    """The reference rows to time beside the schedules (name -> callable) and those skipped (name -> why)."""
    from ccoverlap.runtime.ops import check_call

    op, x, w, cfg = b.op, b.x, b.w, b.cfg
    parts: Parts = {} if b.grad else _forward_parts(b)
    # Every op call above runs the per-call cross-rank check (the default policy); these rows
    # show its cost: serial with the check switched off, and the check alone.
    parts["(serial, unchecked)"] = lambda: call("serial", "never")
    if op in ("all_gather_matmul", "matmul_reduce_scatter"):
        parts["(cross-rank check)"] = lambda: check_call(op, x, w, None, "serial", cfg["comm_engine"], 0, "always")
    skipped: dict[str, str] = {}
    if op in ("all_gather_matmul", "matmul_reduce_scatter") and cfg.get("reference_rows", True):
        _baseline_rows(b, parts, skipped)
    if not cfg.get("reference_rows", True):
        parts.clear()
        skipped = {}
    return parts, skipped


def _forward_parts(b: _RankBench) -> Parts:
    """Forward-only reference rows: the whole collective alone and the GEMM alone, what "serial" is made of."""
    import torch

    from ccoverlap.runtime import comm

    op, x, w, m, k, n = b.op, b.x, b.w, b.cfg["m"], b.cfg["k"], b.cfg["n"]
    device, dtype = b.device, b.dtype
    parts: Parts = {}
    if op == "all_gather_matmul":
        full = torch.empty(m, k, device=device, dtype=dtype)
        parts["(comm only)"] = lambda: comm.all_gather_into(full, x).wait()
        parts["(GEMM only)"] = lambda: full @ w.t()
    elif op == "matmul_reduce_scatter":
        partial = b.rnd(m, n)
        block = torch.empty(m // b.world, n, device=device, dtype=dtype)
        parts["(comm only)"] = lambda: comm.reduce_scatter_into(block, partial).wait()
        parts["(GEMM only)"] = lambda: x @ w.t()
    else:
        recv_x, ybuf, recv_y = torch.empty_like(x), b.rnd(m, n), torch.empty(m, n, device=device, dtype=dtype)

        def a2a_both() -> None:
            comm.all_to_all_single(recv_x, x).wait()
            comm.all_to_all_single(recv_y, ybuf).wait()

        parts["(comm only)"] = a2a_both
        parts["(GEMM only)"] = lambda: x @ w[0].t()
    return parts


def _baseline_rows(b: _RankBench, parts: Parts, skipped: dict[str, str]) -> None:
    """Add PyTorch's DTensor TP and symmetric-memory rows to ``parts``, or why not to ``skipped``."""
    from ccoverlap.runtime.baselines import dtensor_tp_baseline, symm_mem_baseline

    fn, why = dtensor_tp_baseline(b.op, b.x, b.w, b.world, b.device, backward=b.grad)
    if fn is not None:
        parts["(DTensor TP)"] = fn
    else:
        assert why is not None  # the baselines say why whenever they give no function
        skipped["(DTensor TP)"] = why
    fn, why = symm_mem_baseline(b.op, b.x, b.w, b.world, b.device, backward=b.grad)
    if fn is not None:
        parts["(symm-mem fused)"] = fn
    else:
        assert why is not None
        skipped["(symm-mem fused)"] = why


def _first_checked_call(b: _RankBench) -> None:
    """One checked call first: a clear error on every rank if the shapes are wrong."""
    from ccoverlap.runtime import all_gather_matmul, matmul_reduce_scatter

    if b.op == "all_gather_matmul":
        all_gather_matmul(b.x.detach(), b.w.detach(), schedule="serial", check_shapes="always")
    elif b.op == "matmul_reduce_scatter":
        matmul_reduce_scatter(b.x.detach(), b.w.detach(), schedule="serial", check_shapes="always")


def _time_schedules(b: _RankBench, scheds: list[str], parts: Parts, call: OpCall,
                    sync: Callable[[], None]) -> tuple[list[list[float]], list[float | None]]:
    """Warm-up, then ``iters`` timed repetitions; per schedule the slowest rank's seconds per call, and the load."""
    import torch
    import torch.distributed as dist

    from ccoverlap.runtime import comm
    from ccoverlap.runtime.tuning import round_order

    def run_one(name: str) -> object:
        return parts[name]() if name in parts else call(name)

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    # Round-robin: every repetition runs each schedule once, so drift and background
    # load spread over all schedules instead of favouring whichever ran last.
    for _ in range(b.cfg["warmup"]):
        for sched in scheds:
            run_one(sched)
    times: list[list[float]] = [[] for _ in scheds]
    for it in range(b.cfg["iters"]):
        # Williams order (as tune's rounds): over a cycle of repetitions every schedule runs
        # first, and right after every other one, equally often (a plain rotation kept each
        # schedule's predecessor fixed: ring always ran right after serial)
        for i in round_order(len(scheds), it):
            sched = scheds[i]
            sync()
            comm.barrier()
            t0 = time.perf_counter()
            run_one(sched)
            sync()
            times[i].append(time.perf_counter() - t0)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t = torch.tensor(times, dtype=torch.float64, device=comm.comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a call takes as long as its slowest rank
    return t.cpu().tolist(), [load_before, load_after]


def _result_rows(b: _RankBench, scheds: list[str], parts: Parts, slowest: list[list[float]]) -> list[dict[str, Any]]:
    """One row per timed schedule: what it ran (auto's and tune's picks), median, min, every time."""
    rows = []
    for sched, times in zip(scheds, slowest):
        chosen, tune_info = _what_ran(b, sched)
        rows.append({"schedule": sched, "runs": chosen if sched not in parts else "-",
                     "median_s": statistics.median(times), "min_s": min(times), "times_s": times,
                     "reference": sched in parts, "tune": tune_info})
    return rows


def _what_ran(b: _RankBench, sched: str) -> tuple[str, dict[str, Any] | None]:
    """The concrete schedule ``sched`` ran (``auto`` and ``tune`` pick one) and what tune measured."""
    from ccoverlap.runtime.tuning import decision_engine, resolve

    chosen: str = sched
    tune_info: dict[str, Any] | None = None
    if sched in ("auto", "tune") and b.op != "all_to_all_matmul":
        kind = "ag" if b.op == "all_gather_matmul" else "rs"
        a = b.x.detach().reshape(-1, b.cfg["k"])
        # the op's own decision (cached), under the engine it was decided for
        dec = resolve(kind, a, b.w.detach().t(), None, sched, comm_engine=decision_engine(kind, b.cfg["comm_engine"]))
        chosen = dec.schedule
        tune_info = _tune_info(dec) if sched == "tune" else None
    elif sched == "tune":
        from ccoverlap.runtime.tuning import tuning_cache

        cached = next((d for key, d in tuning_cache().items() if key[0] == "a2a"), None)
        chosen = cached.schedule if cached else "serial"
        tune_info = _tune_info(cached) if cached else None
    elif sched == "auto":
        chosen = "chunked" if b.world > 1 else "serial"
    return chosen, tune_info


def _rank0_result(b: _RankBench, rows: list[dict[str, Any]], skipped: dict[str, str], loads: list[float | None]
                  ) -> dict[str, Any]:
    """Rank 0's result: the rows with their speedups over serial, the summary and the run's setting."""
    import torch

    base = next(r["median_s"] for r in rows if r["schedule"] == "serial")
    for r in rows:
        r["speedup_vs_serial"] = None if r["reference"] else (base / r["median_s"] if r["median_s"] > 0 else None)
        r["vs_serial"] = r["median_s"] / base if base > 0 else None
    summary = _summary(rows)
    cfg, op, device, grad = b.cfg, b.op, b.device, b.grad
    m, n, k, e = cfg["m"], cfg["n"], cfg["k"], cfg["experts"]
    flops = 2.0 * m * n * k * (3 if grad else 1)
    return {
        "op": op, "m": m, "n": n, "k": k, "experts": e if op == "all_to_all_matmul" else None,
        "dtype": str(b.dtype).replace("torch.", ""), "world_size": b.world, "backend": b.backend,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "threads_per_rank": b.threads if device.type == "cpu" else None, "backward": grad,
        "comm_engine": cfg["comm_engine"], "warmup": cfg["warmup"], "iters": cfg["iters"],
        "gemm_flops_per_rank": flops, "torch": torch.__version__, "results": rows,
        "profile_dir": cfg["profile_dir"], "loadavg_1m_before_after": loads,
        "summary": summary, "skipped_rows": skipped,
    }  # fmt: skip


def _tune_info(dec: Decision) -> dict[str, Any]:
    """What tune measured, for the table and --json: medians (ms), rounds, elapsed, eliminated."""
    return {
        "picked": dec.schedule, "rounds": dec.rounds, "elapsed_s": dec.elapsed_s, "reason": dec.reason,
        "median_ms": {c: s * 1e3 for c, s in dec.timings_s},
        "samples_ms": {c: [v * 1e3 for v in smp] for c, smp in dec.samples_s},
        "eliminated": list(dec.eliminated),
    }  # fmt: skip


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios the README quotes: auto and tune vs the measured-fastest schedule and vs DTensor TP."""
    by = {r["schedule"]: r for r in rows}
    concrete = [r for r in rows if not r["reference"] and r["schedule"] not in ("auto", "tune")]
    out: dict[str, Any] = {}
    if concrete:
        fastest = min(concrete, key=lambda r: r["median_s"])
        out["fastest_schedule"] = fastest["schedule"]
        out["fastest_median_s"] = fastest["median_s"]
        if "tune" in by:
            picked = by["tune"]["runs"]
            pr = by.get(picked) or by.get(picked.split(":")[0])
            out["tune_pick"] = picked
            if pr is not None:
                out["tune_pick_vs_fastest"] = pr["median_s"] / fastest["median_s"]
                # paired: per repetition (every schedule ran once, round-robin), the pick's time over
                # each other schedule's; the median over repetitions cancels what one repetition's
                # load did to all; the worst over schedules says how far the pick is from the best
                out["tune_pick_vs_fastest_paired"] = max(
                    statistics.median(a / b for a, b in zip(pr["times_s"], r["times_s"]) if b > 0)
                    for r in concrete
                )
            out["tune_row_vs_fastest"] = by["tune"]["median_s"] / fastest["median_s"]
    if "(DTensor TP)" in by:
        d = by["(DTensor TP)"]["median_s"]
        for name in ("serial", "auto", "tune"):
            if name in by and d > 0:
                out[f"{name}_vs_dtensor_tp"] = by[name]["median_s"] / d
        if concrete and d > 0:
            out["best_vs_dtensor_tp"] = out["fastest_median_s"] / d
    if "(cross-rank check)" in by and "serial" in by:
        out["check_share_of_serial"] = by["(cross-rank check)"]["median_s"] / by["serial"]["median_s"]
    if "(serial, unchecked)" in by and "serial" in by:
        out["check_cost_in_serial"] = 1.0 - by["(serial, unchecked)"]["median_s"] / by["serial"]["median_s"]
        pairs = [a / b for a, b in zip(by["serial"]["times_s"], by["(serial, unchecked)"]["times_s"]) if b > 0]
        if pairs:  # per repetition, serial with the check over serial without it
            out["check_cost_in_serial_paired"] = statistics.median(pairs) - 1.0
    return out


def _export_trace(prof: torch.profiler.profile, path: str) -> None:
    """The profiler's Chrome trace written to ``path`` atomically (a temporary file renamed)."""
    from ccoverlap.outputs import atomic_file

    with atomic_file(path) as tmp:
        prof.export_chrome_trace(str(tmp))


def _profile(cfg: BenchConfig, rank: int, call: OpCall, sync: Callable[[], None], device: torch.device) -> None:
    """Profile ``profile_iters`` calls of every schedule into ``DIR/rank-<rank>.json``, one profiler step per call."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.profiler import schedule as prof_schedule

    os.makedirs(cfg["profile_dir"], exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = len(cfg["schedules"]) * cfg["profile_iters"]
    path = os.path.join(cfg["profile_dir"], f"rank-{rank}.json")
    # one profiler step per call, so the trace has ProfilerStep#N spans for `ccoverlap analyze`
    with profile(
        activities=acts,
        schedule=prof_schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: _export_trace(p, path),
    ) as prof:
        call(cfg["schedules"][0])  # the profiler's warm-up step, not recorded
        sync()
        prof.step()
        for sched in cfg["schedules"]:
            for _ in range(cfg["profile_iters"]):
                with record_function(f"ccoverlap.bench.{cfg['op']}.{sched}"):
                    call(sched)
                sync()
                prof.step()


def _print(res: dict[str, Any], as_json: bool) -> None:
    """Rank 0's result as the table (or ``--json``)."""
    if as_json:
        json.dump(res, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    shape = f"M={res['m']} N={res['n']} K={res['k']}" + (f" E={res['experts']}" if res["experts"] else "")
    threads = f", {res['threads_per_rank']} thread(s)/rank" if res["threads_per_rank"] else ""
    print(f"ccoverlap bench: {res['op']} {shape} {res['dtype']}{' fwd+bwd' if res['backward'] else ''}, "
          f"{res['world_size']} ranks, {res['backend']} on {res['device']}{threads}")
    load = res.get("loadavg_1m_before_after") or [None, None]
    load_txt = f"; load average {load[0]:.1f} -> {load[1]:.1f}" if None not in load else ""
    print(f"median of {res['iters']} calls after {res['warmup']} warm-up, round-robin over schedules "
          f"(slowest rank per call){load_txt}")
    hdr = f"{'schedule':<20} {'runs':<18} {'median ms':>10} {'min ms':>9} {'GFLOP/s':>9} {'speedup':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in res["results"]:
        gf = res["gemm_flops_per_rank"] / r["median_s"] / 1e9 if r["median_s"] > 0 else float("nan")
        gf_txt = f"{gf:>9.1f}" if not r["reference"] or r["schedule"] == "(GEMM only)" else f"{'-':>9}"
        sp = r["speedup_vs_serial"]
        sp_txt = f"{sp:>7.2f}x" if sp is not None else f"{'-':>8}"
        print(f"{r['schedule']:<20} {r['runs']:<18} {r['median_s'] * 1e3:>10.2f} {r['min_s'] * 1e3:>9.2f} "
              f"{gf_txt} {sp_txt}")
    for r in res["results"]:
        info = r.get("tune")
        if info:
            print(f"\ntune measured {len(info['median_ms'])} candidates in {info['rounds']} interleaved rounds "
                  f"({info['elapsed_s']:.1f} s; slowest rank per call), picked {info['picked']}:")
            for c, med in sorted(info["median_ms"].items(), key=lambda kv: kv[1]):
                smp = info["samples_ms"].get(c, [])
                note = " (eliminated)" if c in info["eliminated"] else ""
                mark = "  <- picked" if c == info["picked"] else ""
                print(f"  {c:<18} median {med:>9.2f} ms  min {min(smp) if smp else float('nan'):>9.2f} ms  "
                      f"n={len(smp)}{note}{mark}")
    summ = res.get("summary") or {}
    if summ:
        print()
        bits = []
        if "tune_pick_vs_fastest" in summ:
            bits.append(f"tune's pick {summ['tune_pick']} = {summ['tune_pick_vs_fastest']:.3f}x the fastest "
                        f"({summ['fastest_schedule']}) in this run"
                        + (f" (paired per repetition: {summ['tune_pick_vs_fastest_paired']:.3f}x)"
                           if "tune_pick_vs_fastest_paired" in summ else ""))
        for name in ("auto", "tune", "serial"):
            if f"{name}_vs_dtensor_tp" in summ:
                bits.append(f"{name} = {summ[f'{name}_vs_dtensor_tp']:.3f}x DTensor TP")
        if "check_share_of_serial" in summ:
            bits.append(f"cross-rank check alone = {100 * summ['check_share_of_serial']:.2f}% of serial")
        if "check_cost_in_serial" in summ:
            bits.append(f"serial with the check vs without: the check costs {100 * summ['check_cost_in_serial']:.2f}% "
                        "of serial (difference of medians)"
                        + (f"; {100 * summ['check_cost_in_serial_paired']:.2f}% paired per repetition"
                           if "check_cost_in_serial_paired" in summ else ""))
        for b in bits:
            print(b)
    for name, why in (res.get("skipped_rows") or {}).items():
        print(f"{name}: not run ({why})")
    if res["profile_dir"]:
        print(f"traces: {res['profile_dir']}/rank-<r>.json (ccoverlap analyze {res['profile_dir']})")
