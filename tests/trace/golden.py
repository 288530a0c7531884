"""Pinned ``ccoverlap analyze --json`` outputs: what the analyser reports on every real and fixture trace.

``CASES`` names a trace folder (under the shared real traces or ``tests/fixtures/traces``) and the
command-line options; :func:`run_case` runs the command in-process and returns the JSON object with
the folder replaced by ``<TRACES>`` in every string, so the pinned files hold no machine paths.
Regenerate (only when a change of output is intended) with::

    .venv/bin/python tests/trace/golden.py --write
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "traces"
# the shared real traces sit beside the checkout or one folder further up
SHARED = next((p / "shared" / "traces" for p in (ROOT.parent, ROOT.parent.parent)
               if (p / "shared" / "traces").is_dir()), ROOT.parent / "shared" / "traces")
GOLDEN = ROOT / "tests" / "fixtures" / "analyze_golden"

# (case name, "shared" | "fixtures", folder, extra options)
CASES = [(f"{d}{tag}", "shared", d, opts)
         for d in ("amd_trace", "cpu_only", "distributed_info_unavailable", "nccl_parser_config",
                   "ns_resolution_trace", "rank_non_gpu", "trace_filter")
         for tag, opts in (("", []), ("-all", ["--steps", "all"]), ("-exact", ["--time-resolution", "exact"]))]
CASES += [("gloo_2rank", "fixtures", "gloo_2rank", []),
          ("gloo_tpdp_4rank", "fixtures", "gloo_tpdp_4rank", []),
          ("gloo_tpdp_4rank-all", "fixtures", "gloo_tpdp_4rank", ["--steps", "all"]),
          ("overlap50", "fixtures", "synthetic/overlap50", []),
          ("two_steps", "fixtures", "synthetic/two_steps", []),
          ("two_steps-all", "fixtures", "synthetic/two_steps", ["--steps", "all"]),
          ("two_steps-1", "fixtures", "synthetic/two_steps", ["--steps", "1"]),
          ("nccl_parser_config-steps", "shared", "nccl_parser_config", ["--steps", "4-5"])]


def base_dir(where: str) -> Path:
    """The folder a case's traces live under."""
    return SHARED if where == "shared" else FIXTURES


def _strip(x, prefix: str):
    if isinstance(x, dict):
        return {k: _strip(v, prefix) for k, v in x.items()}
    if isinstance(x, list):
        return [_strip(v, prefix) for v in x]
    if isinstance(x, str):
        return x.replace(prefix, "<TRACES>")
    return x


def run_case(where: str, folder: str, opts: list[str]) -> dict:
    """``ccoverlap analyze --json`` of one case, paths replaced by ``<TRACES>``."""
    from ccoverlap.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(["analyze", str(base_dir(where) / folder), "--json", *opts])
    doc = json.loads(out.getvalue())
    doc.pop("png", None)
    return _strip(doc, str(base_dir(where)))


def run_case_text(where: str, folder: str, opts: list[str]) -> str:
    """The tables ``ccoverlap analyze`` prints for one case (120 columns), paths replaced by ``<TRACES>``."""
    import os

    from ccoverlap.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "120"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["analyze", str(base_dir(where) / folder), *opts])
    finally:
        if old is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = old
    text = "\n".join(line for line in out.getvalue().splitlines() if not line.startswith("picture: "))
    return text.replace(str(base_dir(where)), "<TRACES>")


def diff(a, b, path: str = "$", rel: float = 1e-9, out: list | None = None) -> list[str]:
    """Where two JSON values differ (floats: beyond ``rel`` relative, 1e-15 absolute)."""
    out = [] if out is None else out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'new' if k in a else 'pinned'}")
            else:
                diff(a[k], b[k], f"{path}.{k}", rel, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} items, pinned {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", rel, out)
    elif isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)):
            out.append(f"{path}: {a!r} != pinned {b!r}")
    elif a != b or type(a) is not type(b):
        out.append(f"{path}: {a!r} != pinned {b!r}")
    return out


def main() -> int:
    if "--write" not in sys.argv:
        print(__doc__)
        return 2
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, where, folder, opts in CASES:
        if not (base_dir(where) / folder).is_dir():
            print(f"skipped {name}: {base_dir(where) / folder} not present")
            continue
        doc = run_case(where, folder, opts)
        with gzip.open(GOLDEN / f"{name}.json.gz", "wt", compresslevel=9) as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        (GOLDEN / f"{name}.txt").write_text(run_case_text(where, folder, opts) + "\n")
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
