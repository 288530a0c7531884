"""From a workload to a recommendation: the built-in strategies and the registry of all of them
(:mod:`~ccoverlap.planning.strategies`), the layout search (:mod:`~ccoverlap.planning.search`), the
report, and the settings a decision is applied with (:mod:`ccoverlap.planning.emit`)."""
