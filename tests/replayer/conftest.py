"""Where the real traces are: ``CCOVERLAP_SHARED_TRACES`` if set, else ``../shared/traces``
next to the checkout (tests on them skip when neither exists)."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("CCOVERLAP_SHARED_TRACES") or Path(__file__).resolve().parents[3] / "shared" / "traces")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
