"""Output of ``ccoverlap analyze`` without the terminal tables: the one JSON object of ``--json``
and the warning lines on stderr. Kept apart from :mod:`ccoverlap.trace.report` (rich tables, the
picture) so that ``--json`` starts without importing rich."""

from __future__ import annotations

import json
from typing import IO

from ccoverlap.trace.result import COMM_KERNEL_KEYS, Analysis, comm_kernel_columns

#: warning lines printed before the rest are counted in one line (a job of 10,000 unreadable
#: ranks would otherwise bury the report under 10,000 lines)
MAX_PROBLEM_LINES = 20


def print_problems(problems: list[str], file: IO, command: str = "analyze") -> None:
    """One ``warning:`` line per problem (file name first), the first :data:`MAX_PROBLEM_LINES`
    of them, then one line counting the others (``--json`` lists every one under ``problems``)."""
    for p in problems[:MAX_PROBLEM_LINES]:
        file.write(f"ccoverlap {command}: warning: {p}\n")
    if len(problems) > MAX_PROBLEM_LINES:
        file.write(f"ccoverlap {command}: warning: ... and {len(problems) - MAX_PROBLEM_LINES} more problem(s) "
                   f"(--json lists every one under 'problems')\n")


#: stands for the ``comm_kernels`` list while the rest of the object is encoded
_ROWS = "\0comm_kernels\0"
#: one row as ``json.dumps(..., indent=2)`` writes a flat object two levels deep, from the C encoder
_ROW_SEP = ",\n      "
#: what separates two rows in that layout
_ROW_BREAK = "\n    },\n    {\n      "
#: one row's fields in that layout, each value's JSON text in place of its %s
_ROW = _ROW_SEP.join(f"{json.dumps(k)}: %s" for k in COMM_KERNEL_KEYS)


def _json_texts(values: list) -> list[str]:
    """The JSON text of each value (``json.dumps`` of it): a column of one type at a time (ints,
    floats or None, strings repeating), so a repeated value is encoded once."""
    kinds = set(map(type, values))
    if kinds <= {int}:
        return list(map(int.__repr__, values))
    if kinds <= {float, type(None)}:     # finite floats (json_ready made the others None)
        return ["null" if v is None else repr(v) for v in values]
    if kinds <= {str, type(None)}:
        memo: dict = {}
        return [memo[v] if v in memo else memo.setdefault(v, json.dumps(v)) for v in values]
    return [json.dumps(v, allow_nan=False) for v in values]


def write_json(a: Analysis, file: IO, extra: dict | None = None) -> None:
    """The analysis as one JSON object (strict JSON: no NaN / Infinity), as ``json.dump(a.to_dict(),
    indent=2)`` writes it. The ``comm_kernels`` rows - one per communication kernel of the job,
    the bulk of a large job's output - are encoded and written a few thousand at a time (lists of
    flat objects, by the standard library's C encoder), never held as one list."""
    doc = a.to_dict(comm_kernels=_ROWS)
    if extra:
        doc.update(extra)
    key = '"comm_kernels": '
    head, _, tail = json.dumps(doc, indent=2, allow_nan=False).partition(key + json.dumps(_ROWS))
    file.write(head + key)
    sep = "[\n    "
    for cols in comm_kernel_columns(a):
        file.write(sep + "{\n      " + _ROW_BREAK.join(map(_ROW.__mod__, zip(*map(_json_texts, cols)))) + "\n    }")
        sep = ",\n    "
    file.write("[]" if sep.startswith("[") else "\n  ]")
    file.write(tail)
    file.write("\n")
