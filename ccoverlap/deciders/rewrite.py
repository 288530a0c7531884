"""Graph rewrites for the deciders: :class:`~ccoverlap.sim.rewrite.GraphRewrite` and
:class:`~ccoverlap.sim.rewrite.Piece` live in :mod:`ccoverlap.sim.rewrite` (the step builders
use them too); this module names them for the deciders."""

from ccoverlap.sim.rewrite import GraphRewrite, Piece

__all__ = ["GraphRewrite", "Piece"]
