"""From a decision to a running job: a strategy's settings in the forms NCCL, PyTorch and the
training frameworks take, what of it can be applied, and the ``applicable`` plan row.

* :func:`build_emit` (:mod:`.applicable`): one strategy's :class:`EmitBundle` — framework
  settings per target (:mod:`.frameworks`), stock NCCL's settings
  (:mod:`ccoverlap.nccl.apply`), and the strategy re-simulated with only what can be
  applied;
* :func:`write_emit` / :func:`read_emit` / :func:`hints` (:mod:`.files`): the ``--emit DIR``
  files, read back, or as Python data.

docs/emit.md describes the files and how to launch with them. No torch here.
"""

from .applicable import APPLICABLE, EmitBundle, build_comm_emit, build_emit
from .decision import Decision
from .files import hints, read_emit, write_emit
from .frameworks import TARGETS

__all__ = ["APPLICABLE", "EmitBundle", "build_emit", "build_comm_emit", "Decision", "hints", "read_emit", "write_emit", "TARGETS"]
