"""``ccoverlap calibrate``: measure one CUDA GPU and fit the cost model to it.

* :mod:`.grids`      — what is measured (shapes, the ficco paper's GEMMs scaled, NC/NT/C grid,
  the deterministic train / held-out split); pure Python.
* :mod:`.microbench` — CUDA-event timing, medians, overlap runs on two streams (torch, CUDA).
* :mod:`.kernels`    — the NC-block / NT-thread / C-byte-chunk channel-copy kernel (lagom §3.2).
* :mod:`.suite`      — the whole measurement run.
* :mod:`.fit`        — the cost model as model functions, bounded least squares, held-out error
  (numpy; no torch).
* :mod:`.fileformat` — the calibration JSON: read, write, validate (versioned).

Only :mod:`.microbench`, :mod:`.kernels` and :mod:`.suite` need torch, imported lazily.
"""
