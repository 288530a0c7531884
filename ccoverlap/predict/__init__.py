"""Predicting one workload's step: the workload (:mod:`~ccoverlap.predict.workload`), its step built and
simulated and summarised (:mod:`~ccoverlap.predict.evaluate`), and the strategy interface with the
:class:`~ccoverlap.predict.strategy.Planner` every strategy is handed (:mod:`~ccoverlap.predict.strategy`)."""
