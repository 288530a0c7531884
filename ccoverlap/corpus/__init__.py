"""Measurements the cost model is fitted and judged on: public benchmark tables and the
project's own GPU runs, each kept as data with its source.

* :mod:`~ccoverlap.corpus.tables` — one table: a CSV of measurements under
  ``ccoverlap/data/corpus/<kind>/<name>.csv`` beside ``<name>.yaml`` naming its source
  (repository, path, commit, licence), the hardware it ran on, its columns' units and the
  columns that declare its fit / held-out split.

Numbers are facts and carry over from their sources; no code does. Which model a table
judges, and how, lives in :mod:`ccoverlap.validation`.
"""
