"""Predicted vs published step times of real training runs: a thin wrapper over
``ccoverlap validate`` on the published set shipped with the package
(ccoverlap/data/runs/published.yaml), kept so the benchmark scripts stay in one place.

    .venv/bin/python benchmarks/validate_published.py --markdown        # = ccoverlap validate published --markdown
    .venv/bin/python benchmarks/validate_published.py --details
    .venv/bin/python benchmarks/validate_published.py --sensitivity --markdown   # other readings of the sources
    .venv/bin/python benchmarks/validate_published.py --fit gemm_peak_fraction --fit-on fit

``--sensitivity`` runs benchmarks/published_sensitivity.yaml instead: the same sources under
other plausible readings where they are silent (docs/validation.md, "Sensitivity").
Every other argument goes to ``ccoverlap validate`` unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ccoverlap.cli import main

SENSITIVITY = Path(__file__).resolve().parent / "published_sensitivity.yaml"

if __name__ == "__main__":
    args = sys.argv[1:]
    target = "published"
    if "--sensitivity" in args:
        args.remove("--sensitivity")
        target = str(SENSITIVITY)
    sys.exit(main(["validate", target, *args]))
