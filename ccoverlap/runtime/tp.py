"""Drop-in ParallelStyles for ``torch.distributed.tensor.parallel.parallelize_module``.

A torch tensor-parallel plan with sequence parallelism, e.g.::

    plan = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(), ...,
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    }

becomes overlapped by changing only the style classes: :class:`ColwiseParallel`,
:class:`RowwiseParallel` and :class:`PrepareModuleInput` from this module (``SequenceParallel``
is re-exported unchanged). What changes underneath:

* our ``PrepareModuleInput`` all-gathers a sequence-sharded input the plan wants replicated
  once (:mod:`ccoverlap.runtime.shared_gather`) and hands the module what torch's hands it (a
  ``Replicate()`` DTensor, or its local tensor with ``use_local_output=True``); while the
  cross-rank check and the gather travel it computes this rank's rows of the module's
  column-parallel projections;
* our ``ColwiseParallel`` on that gathered input multiplies only the other ranks' rows, on
  local tensors, and adds its input-gradient partial to its siblings' before one
  reduce-scatter in backward; on a sequence-sharded input of its own it runs
  :func:`~ccoverlap.runtime.ops.all_gather_matmul` (overlapped, forward and backward);
* our ``RowwiseParallel`` with a sequence-sharded output runs
  :func:`~ccoverlap.runtime.ops.matmul_reduce_scatter` instead of GEMM + reduce-scatter.

Every other layout falls back to DTensor's own math, so results never depend on which path
ran. Parameters are DTensors with torch's placements (colwise weight/bias ``Shard(0)``,
rowwise weight ``Shard(1)``, rowwise bias ``Replicate()``): a state_dict saved from an
overlapped model is the same as torch TP's and loads into either. :func:`load_full_state_dict`
loads an unsharded state_dict into a parallelized model (torch or ours) and
:func:`full_state_dict` gathers one back. Inputs are batch-first ``[b, s, h]`` by default;
the sequence dim is whatever ``Shard(d)`` the plan names.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import PrepareModuleInput as _TorchPrepareModuleInput
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise
from torch.distributed.tensor.parallel import SequenceParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

from ccoverlap.errors import ConfigError
from ccoverlap.runtime.ops import all_gather_matmul, check_schedule, matmul_reduce_scatter
from ccoverlap.runtime.shared_gather import gather_input, gathered_linear, shared_gather_of

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.nn.modules.module import _IncompatibleKeys

__all__ = [
    "ColwiseParallel",
    "RowwiseParallel",
    "PrepareModuleInput",
    "SequenceParallel",
    "load_full_state_dict",
    "full_state_dict",
]

_ = Partial  # re-exported placements users may need alongside the styles


def _one(layouts: Placement | Sequence[Placement] | None, default: Placement) -> Placement:
    if layouts is None:
        return default
    if isinstance(layouts, (tuple, list)):
        if len(layouts) != 1:
            raise ConfigError(f"expected one placement for a linear layer, got {layouts}")
        return layouts[0]
    return cast(Placement, layouts)  # one placement, not in a sequence


def _seq_dim(p: Placement, ndim: int) -> int | None:
    """The sharded dim of ``p`` when it is a sequence-style shard (not the last dim), else None."""
    if isinstance(p, Shard):
        d = p.dim % ndim
        if d != ndim - 1:
            return d
    return None


def _check_mesh(mesh: DeviceMesh, who: str) -> ProcessGroup:
    if mesh.ndim != 1:
        raise ConfigError(f"{who}: needs a 1-D DeviceMesh (the tensor-parallel dim), got {mesh.ndim}-D")
    return mesh.get_group()


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter our styles made a DTensor (:func:`_shard_param`)."""
    return cast(DTensor, param).to_local()


def _shard_param(
    module: nn.Module, name: str, mesh: DeviceMesh, placements: Sequence[Placement], src_data_rank: int | None
) -> None:
    p = getattr(module, name, None)
    if p is None:
        return
    dt = distribute_tensor(p.data, mesh, placements, src_data_rank=src_data_rank)
    module.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))


class _OverlappedLinearStyle(ParallelStyle):
    """What ColwiseParallel and RowwiseParallel share: torch's arguments plus ``schedule`` /
    ``comm_engine``, sharding an ``nn.Linear``'s weight and bias with the subclass's placements
    and routing its forward to the subclass's ``_forward``; any other module goes to torch's
    own style (``_torch_style``)."""

    _torch_style: type
    _default_input: Placement
    _default_output: Placement
    _weight_placement: Placement
    _bias_placement: Placement

    def __init__(
        self, *, input_layouts: Placement | Sequence[Placement] | None = None,
        output_layouts: Placement | Sequence[Placement] | None = None, use_local_output: bool = True,
        schedule: str = "auto", comm_engine: str = "sm",
    ) -> None:  # fmt: skip
        super().__init__()
        self.input_layout = _one(input_layouts, self._default_input)
        self.output_layout = _one(output_layouts, self._default_output)
        self.use_local_output = use_local_output
        check_schedule(schedule)
        self.schedule = schedule
        self.comm_engine = comm_engine

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Linear):
            return self._torch_style(
                input_layouts=self.input_layout, output_layouts=self.output_layout,
                use_local_output=self.use_local_output,
            )._apply(module, device_mesh)  # fmt: skip
        group = _check_mesh(device_mesh, type(self).__name__)
        _shard_param(module, "weight", device_mesh, [self._weight_placement], self.src_data_rank)
        _shard_param(module, "bias", device_mesh, [self._bias_placement], self.src_data_rank)
        module.forward = partial(self._forward, module, device_mesh, group)  # type: ignore[method-assign]  # per instance, as torch's styles route it
        module._ccoverlap_style = self  # type: ignore[assignment]  # Module.__setattr__ is typed for tensors and modules only
        return module

    def _forward(self, module: nn.Linear, mesh: DeviceMesh, group: ProcessGroup, x: torch.Tensor) -> torch.Tensor:
        """The overlapped forward of ``module`` on input ``x`` (each style has its own)."""
        raise NotImplementedError


class ColwiseParallel(_OverlappedLinearStyle):
    """``torch``'s ``ColwiseParallel``, with the all-gather of its input shared or overlapped.

    Same arguments as torch's (``input_layouts``, ``output_layouts``, ``use_local_output``)
    plus ``schedule`` (any of :data:`~ccoverlap.runtime.ops.ALL_SCHEDULES`) and
    ``comm_engine``. What runs, by input:

    * the input :class:`PrepareModuleInput` gathered for its module (a ``Replicate()`` DTensor
      or, with ``use_local_output=True``, its local tensor): ``y = x_full @ W_r.T + b_r`` on
      local tensors, the input gradient added to the other projections' before the gather's
      one reduce-scatter (:mod:`ccoverlap.runtime.shared_gather`);
    * a sequence-sharded input (a DTensor with a ``Shard(d)`` placement, d not the last dim,
      or a plain tensor with ``input_layouts=Shard(d)``): :func:`all_gather_matmul` on ``dim=d``,
      the all-gather overlapped with the GEMM, forward and backward;
    * anything else: DTensor's own math, exactly torch's style.

    Works on ``nn.Linear``; other modules go to torch's style.
    """

    _torch_style = _TorchColwise
    _default_input = Replicate()
    _default_output = Shard(-1)
    _weight_placement = Shard(0)
    _bias_placement = Shard(0)

    def _forward(self, module: nn.Linear, mesh: DeviceMesh, group: ProcessGroup, x: torch.Tensor) -> torch.Tensor:
        st = shared_gather_of(x)
        if st is not None and st.mesh == mesh and (isinstance(x, DTensor) or self.input_layout == Replicate()) and (
            not torch.is_autocast_enabled(x.device.type)  # under autocast: DTensor's math (torch's casts)
        ):
            bias = _local(module.bias) if module.bias is not None else None
            return self._output(gathered_linear(x, module, _local(module.weight), bias, st), mesh)
        if isinstance(x, DTensor):
            seq = _seq_dim(x.placements[0], x.ndim)
            local = x.to_local() if seq is not None else None
        else:
            seq = _seq_dim(self.input_layout, x.ndim)
            local = x if seq is not None else None
        if seq is None or local is None:  # not sequence-sharded (or a gathered input under autocast): DTensor's math
            xd = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [self.input_layout], run_check=False)
            if xd.placements[0] != Replicate():
                xd = xd.redistribute(mesh, [Replicate()])
            out = cast(DTensor, F.linear(xd, module.weight, module.bias))
            if out.placements[0] != self.output_layout:
                out = out.redistribute(mesh, [self.output_layout])
            return out.to_local() if self.use_local_output else out
        b_local = _local(module.bias) if module.bias is not None else None
        xa, wa, ba = _autocast(local, _local(module.weight), b_local)
        y = all_gather_matmul(xa, wa, group, schedule=self.schedule, comm_engine=self.comm_engine, dim=seq)
        return self._output(y + ba if ba is not None else y, mesh)

    def _output(self, y: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        """The module's output from this rank's ``Shard(-1)`` slice ``y``: torch's output layout and type."""
        if _is_last_dim_shard(self.output_layout, y.ndim):
            return y if self.use_local_output else DTensor.from_local(y, mesh, [Shard(y.ndim - 1)], run_check=False)
        out = DTensor.from_local(y, mesh, [Shard(y.ndim - 1)], run_check=False).redistribute(mesh, [self.output_layout])
        return out.to_local() if self.use_local_output else out


def _autocast(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(x, weight, bias)`` in autocast's dtype when autocast is on for their device, as ``F.linear``
    casts them (so the collective runs in that dtype too, as torch's does); unchanged otherwise."""
    dev = x.device.type
    if not torch.is_autocast_enabled(dev):
        return x, weight, bias
    dt = torch.get_autocast_dtype(dev)
    return x.to(dt), weight.to(dt), (bias.to(dt) if bias is not None else None)


def _is_last_dim_shard(p: Placement, ndim: int) -> bool:
    return isinstance(p, Shard) and p.dim % ndim == ndim - 1


class RowwiseParallel(_OverlappedLinearStyle):
    """``torch``'s ``RowwiseParallel`` with the reduce-scatter to a sequence shard overlapped.

    Same arguments as torch's plus ``schedule``/``comm_engine``. When ``output_layouts`` is
    ``Shard(d)`` (d not the last dim, e.g. ``Shard(1)`` for ``[b, s, h]``) the layer runs
    :func:`matmul_reduce_scatter` on ``dim=d`` and adds the replicated bias after it (as a
    DTensor op, so its gradient is summed over ranks); otherwise DTensor's math runs.
    ``nn.Embedding`` and other modules go to torch's style.
    """

    _torch_style = _TorchRowwise
    _default_input = Shard(-1)
    _default_output = Replicate()
    _weight_placement = Shard(1)
    _bias_placement = Replicate()

    def _forward(self, module: nn.Linear, mesh: DeviceMesh, group: ProcessGroup, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):
            xd = x if _is_last_dim_shard(x.placements[0], x.ndim) else x.redistribute(mesh, [Shard(-1)])
            local = xd.to_local()
        elif _is_last_dim_shard(self.input_layout, x.ndim):
            local = x
        else:
            local = DTensor.from_local(x, mesh, [self.input_layout], run_check=False).redistribute(
                mesh, [Shard(-1)]
            ).to_local()
        seq = _seq_dim(self.output_layout, local.ndim)
        if seq is None:
            xd = DTensor.from_local(local, mesh, [Shard(-1)], run_check=False)
            out = cast(DTensor, F.linear(xd, module.weight, module.bias)).redistribute(mesh, [self.output_layout])
            return out.to_local() if self.use_local_output else out
        local, weight, bias = _autocast(local, _local(module.weight), module.bias)
        y = matmul_reduce_scatter(local, weight, group, schedule=self.schedule, comm_engine=self.comm_engine, dim=seq)
        if bias is None and self.use_local_output:
            return y
        out = DTensor.from_local(y, mesh, [Shard(seq)], run_check=False)
        if bias is not None:
            out = cast(DTensor, out + bias)  # DTensor add: the bias gradient is summed over ranks
        return out.to_local() if self.use_local_output else out


class PrepareModuleInput(_TorchPrepareModuleInput):
    """``torch``'s ``PrepareModuleInput``; ``Shard(d) -> Replicate()`` is one shared all-gather.

    Where the plan gathers a sharded input before the module, the module gets exactly what
    torch's style gives it: a ``Replicate()`` DTensor of the whole input, or its local
    tensor with ``use_local_output=True`` (a router or custom kernel that calls
    ``to_local()`` sees the whole sequence). The gather runs once
    (:func:`~ccoverlap.runtime.shared_gather.gather_input`, checked across ranks); our
    :class:`ColwiseParallel` projections that read the gathered input run on local tensors
    and add their input-gradient partial sums before one reduce-scatter in backward. Other
    conversions, and meshes of more than one dim, are torch's.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        # torch's hooks, with the module at hand while its inputs are prepared (for _consumers)
        if self.with_kwargs:
            module.register_forward_pre_hook(
                lambda mod, args, kwargs: self._with_module(mod, self._prepare_input_kwarg_fn, args, kwargs, device_mesh),
                with_kwargs=True,
            )  # fmt: skip
        else:
            module.register_forward_pre_hook(
                lambda mod, args: self._with_module(mod, self._prepare_input_fn, args, device_mesh)
            )
        return module

    @staticmethod
    def _with_module(mod: nn.Module, fn: Callable[..., Any], *args: Any) -> Any:  # torch's hook arguments and result
        token = _PREPARING.set(mod)
        try:
            return fn(*args)
        finally:
            _PREPARING.reset(token)

    def _prepare_input_arg(
        self, input: Any, mesh: DeviceMesh, input_layout: Placement | None, desired_layout: Placement | None
    ) -> Any:  # any module argument: only tensors are converted
        if input_layout is not None and desired_layout == Replicate() and mesh.ndim == 1 and isinstance(input, torch.Tensor):
            have = input.placements[0] if isinstance(input, DTensor) else input_layout
            if isinstance(have, Shard):
                return gather_input(input, mesh, have.dim, use_local_output=self.use_local_output,
                                    consumers=_consumers(_PREPARING.get(), mesh))  # fmt: skip
        return super()._prepare_input_arg(input, mesh, input_layout, desired_layout)


#: The module whose inputs our PrepareModuleInput is preparing (set around torch's hook body).
_PREPARING: contextvars.ContextVar[nn.Module | None] = contextvars.ContextVar("ccoverlap_preparing", default=None)


def _consumers(mod: nn.Module | None, mesh: DeviceMesh) -> list[nn.Module]:
    """``mod``'s direct children that our ColwiseParallel runs on a replicated input on ``mesh``: the
    projections that will read the gathered input (their local rows are computed during the gather)."""
    if mod is None:
        return []
    out: list[nn.Module] = []
    for child in mod.children():
        style = getattr(child, "_ccoverlap_style", None)
        w = getattr(child, "weight", None)
        if (isinstance(style, ColwiseParallel) and style.input_layout == Replicate()
                and isinstance(w, DTensor) and w.device_mesh == mesh):  # fmt: skip
            out.append(child)
    return out


@torch.no_grad()
def load_full_state_dict(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True
) -> _IncompatibleKeys:
    """Load an unsharded (single-process) ``state_dict`` into a tensor-parallel ``model``.

    Every DTensor parameter/buffer of ``model`` gets this rank's part of the full tensor
    (``distribute_tensor`` with its own mesh and placements, no communication: every rank
    holds the full state_dict); plain entries load as usual. Works for models parallelized
    with torch's styles or with these. Returns ``load_state_dict``'s result.
    """
    own = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    for name, value in state_dict.items():
        target = own.get(name)
        if isinstance(target, DTensor) and not isinstance(value, DTensor):
            if tuple(value.shape) != tuple(target.shape):
                raise ConfigError(
                    f"load_full_state_dict: {name} has shape {tuple(value.shape)}, the model's full shape is "
                    f"{tuple(target.shape)}"
                )
            value = distribute_tensor(
                value.to(device=target.device, dtype=target.dtype), target.device_mesh, target.placements,
                src_data_rank=None,
            )  # fmt: skip
        converted[name] = value
    return model.load_state_dict(converted, strict=strict)


@torch.no_grad()
def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state_dict of a tensor-parallel ``model`` (collective: every DTensor is gathered)."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in model.state_dict().items()}
