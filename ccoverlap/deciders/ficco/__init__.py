"""FiCCO (finer-grain collective + GEMM decomposition): the paper's decision procedure.

- :mod:`~ccoverlap.deciders.ficco.heuristic` — the static schedule heuristic (§V-C, Fig. 12(a));
- :mod:`~ccoverlap.deciders.ficco.schedules` — every schedule's time on the cost model (§IV, §V-B);
- :mod:`~ccoverlap.deciders.ficco.accuracy` — the heuristic judged against the estimator (§VI-D);
- :mod:`~ccoverlap.deciders.ficco.plan` — the planner strategy ``ficco`` on a whole step.
"""
