"""One measurement table of the corpus: rows of a CSV file and the source they come from.

A table ``NAME`` of kind ``KIND`` (``collective``, ``gemm``, ``attention``, ``memory``,
``contention``, ...) is two files under ``ccoverlap/data/corpus/KIND/``:

* ``NAME.csv``  — one measurement a row, a header line of column names; numbers in the
  units the metadata gives;
* ``NAME.yaml`` — its metadata::

      source:
        repository: microsoft/vidur        # or a paper / issue thread: "arXiv:2407.08608 Fig. 5"
        path: data/profiling/a40/all_reduce.csv
        commit: 0123abcd...                # the upstream commit the numbers were read at
        licence: MIT
        url: https://...                   # optional
      hardware: 8 x A40, NVLink bridges in pairs, PCIe 4.0   # what the numbers were measured on
      gpu: A40                             # catalog GPU name (ccoverlap list gpus)
      units: {time_s: s, nbytes: bytes}
      split_key: [collective, nbytes]      # columns whose values decide fit / held-out
      notes: how the rows were read, what was left out and why

The split is declared, not chosen per use: a row is in the ``fit`` half when the CRC-32 of
its ``split_key`` values (joined with ``|``) is even, else ``held-out``: the same for every
reader, stable as rows are added, about half and half.
"""

from __future__ import annotations

import csv
import io
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ccoverlap.config import check_keys, read_config_file, short
from ccoverlap.errors import ConfigError

#: Where the shipped tables live.
CORPUS_DIR = Path(__file__).resolve().parent.parent / "data" / "corpus"
#: The two halves of a table.
SPLITS = ("fit", "held-out")
_SOURCE_KEYS = ("repository", "path", "commit", "licence", "url")
_META_KEYS = ("source", "hardware", "gpu", "units", "split_key", "notes")


@dataclass(frozen=True)
class Source:
    """Where a table's numbers come from: ``repository`` (or a paper / issue thread), the
    ``path`` in it, the ``commit`` they were read at, the ``licence`` and an optional ``url``."""

    repository: str
    path: str
    commit: str
    licence: str
    url: str = ""

    def cite(self) -> str:
        """One line naming the source: ``repository path@commit (licence)``."""
        at = f"@{self.commit[:12]}" if self.commit else ""
        return f"{self.repository} {self.path}{at} ({self.licence})"


@dataclass(frozen=True)
class Table:
    """A measurement table: ``rows`` (column -> float, or str where the value is not a number)
    with its ``source``, the ``hardware`` and catalog ``gpu`` it ran on, column ``units`` and
    the ``split_key`` columns that declare each row's half (:meth:`split_of`)."""

    kind: str
    name: str
    source: Source
    hardware: str
    gpu: str
    units: dict[str, str]
    split_key: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    notes: str = ""

    def split_of(self, row: dict[str, Any]) -> str:
        """``"fit"`` or ``"held-out"``: the declared half of ``row`` (module docstring)."""
        key = "|".join(_key_text(row[c]) for c in self.split_key)
        return SPLITS[zlib.crc32(key.encode()) % 2]

    def half(self, split: str) -> list[dict[str, Any]]:
        """The rows of one half, ``"fit"`` or ``"held-out"`` (``"all"``: every row)."""
        if split == "all":
            return list(self.rows)
        if split not in SPLITS:
            raise ConfigError(f"corpus split must be one of {SPLITS + ('all',)}, got {short(split)}")
        return [r for r in self.rows if self.split_of(r) == split]


def _key_text(value: Any) -> str:
    """A split-key value as text that does not depend on how a number was written."""
    return repr(float(value)) if isinstance(value, (int, float)) else str(value)


def _number_or_text(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _read_rows(path: Path) -> tuple[dict[str, Any], ...]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the corpus table: {exc.strerror or type(exc).__name__}") from None
    reader = csv.DictReader(io.StringIO(text))
    rows = []
    for line, raw in enumerate(reader, start=2):
        if None in raw or any(v is None for v in raw.values()):
            raise ConfigError(f"{path}:{line}: expected {len(reader.fieldnames or ())} columns")
        rows.append({k: _number_or_text(v) for k, v in raw.items()})
    if not rows:
        raise ConfigError(f"{path}: the corpus table has no rows")
    return tuple(rows)


def load_table(kind: str, name: str, *, root: Path | None = None) -> Table:
    """The table ``name`` of ``kind`` (its CSV and YAML under ``root``, default
    :data:`CORPUS_DIR`); ConfigError naming the file on any problem."""
    base = (root or CORPUS_DIR) / kind
    meta_path, csv_path = base / f"{name}.yaml", base / f"{name}.csv"
    if not meta_path.is_file() or not csv_path.is_file():
        known = ", ".join(table_names(kind, root=root)) or "none"
        raise ConfigError(f"no corpus table {short(name)} of kind {short(kind)} (known: {known})")
    meta = check_keys(read_config_file(meta_path), _META_KEYS, str(meta_path))
    src = check_keys(meta.get("source"), _SOURCE_KEYS, f"{meta_path}: source")
    missing = [k for k in ("repository", "path", "commit", "licence") if not src.get(k)]
    if missing:
        raise ConfigError(f"{meta_path}: source lacks {', '.join(missing)}")
    rows = _read_rows(csv_path)
    split_key = tuple(meta.get("split_key") or ())
    unknown = [c for c in split_key if c not in rows[0]]
    if not split_key or unknown:
        raise ConfigError(f"{meta_path}: split_key must name columns of {csv_path.name}, got {short(list(split_key))}")
    return Table(kind=kind, name=name, source=Source(**{k: str(v) for k, v in src.items()}),
                 hardware=str(meta.get("hardware", "")), gpu=str(meta.get("gpu", "")),
                 units={str(k): str(v) for k, v in (meta.get("units") or {}).items()},
                 split_key=split_key, rows=rows, notes=str(meta.get("notes", "")))


def table_names(kind: str, *, root: Path | None = None) -> list[str]:
    """Names of the tables of ``kind`` (sorted); empty when there are none."""
    base = (root or CORPUS_DIR) / kind
    return sorted(p.stem for p in base.glob("*.yaml") if (base / f"{p.stem}.csv").is_file())


def load_kind(kind: str, *, root: Path | None = None) -> list[Table]:
    """Every table of ``kind``."""
    return [load_table(kind, n, root=root) for n in table_names(kind, root=root)]
