"""``ccoverlap calibrate``: measure this GPU and fit the cost model's parameters to it.

Runs microbenchmarks on one CUDA GPU (GEMM sweep and decomposition loss, copy bandwidth,
an NC/NT/C channel-copy kernel and copy-engine copies beside GEMMs and a memory-bound op),
fits the cost model on part of the measurements, prints its error on the rest, and writes a
calibration file for ``plan``, ``simulate``, ``tune`` and the runtime (``--calibration FILE``).
``--refit FILE`` redoes only the fit from a calibration file's raw measurements (no GPU).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ccoverlap.calibrate.grids import SECTIONS
from ccoverlap.commands.options import Subparsers, add_common
from ccoverlap.errors import ConfigError

if TYPE_CHECKING:
    from ccoverlap.calibrate.fit import CalibrationFit
    from ccoverlap.catalog.hardware import GPUSpec
    from ccoverlap.cost.params import CostParams

#: a measurement record, a calibration file's document, its settings or device: JSON-ready mappings
Record = dict[str, Any]
#: ``log(message)``: one progress line on stderr
Log = Callable[[str], None]
#: ``checkpoint(records, notes, settings, device info, gpu)``: write what was measured so far
Checkpoint = Callable[[list[Record], list[str], Record, Record, "GPUSpec"], None]


def register(sub: Subparsers) -> None:
    """Add the ``calibrate`` subcommand and its options to the CLI's subparsers."""
    p = sub.add_parser("calibrate", help="measure this GPU and fit the cost model (writes a calibration file)",
                       description=__doc__)
    p.add_argument("--out", metavar="DIR", help="directory for the calibration file DIR/<gpu-name>.json "
                   "(default calibrations/; a name ending in .json is the file itself)")
    p.add_argument("--quick", action="store_true", help="a smaller plan (a few minutes instead of ~20)")
    p.add_argument("--device", default=None, help="CUDA device to measure: cuda, cuda:N or N (default: current)")
    p.add_argument("--gpu", help="catalog GPU the parameters are for (default: recognised from the device name)")
    p.add_argument("--kernel", choices=("auto", "cuda", "triton"), default="auto",
                   help="channel-copy kernel backend: load_inline CUDA, Triton, or the first that builds")
    p.add_argument("--refit", metavar="FILE", help="fit again from the measurements in FILE (no GPU needed)")
    p.add_argument("--sections", metavar="LIST", default=",".join(SECTIONS),
                   help=f"measure only these, comma-separated (default all: {','.join(SECTIONS)}); "
                        "a plan too long for one slot runs in parts joined with --add")
    p.add_argument("--add", metavar="FILE", action="append", default=[],
                   help="also fit the measurements of FILE, an earlier calibration file of the same GPU "
                        "(repeatable; where both measured the same thing, this run's value is kept)")
    add_common(p)
    p.set_defaults(run=run)


def parse_sections(text: str) -> tuple[str, ...]:
    """The ``--sections`` list as a tuple in measuring order; ConfigError naming an unknown one."""
    from ccoverlap.config import suggest

    names = [t.strip() for t in str(text).split(",") if t.strip()]
    for name in names:
        if name not in SECTIONS:
            raise ConfigError(f"--sections: unknown section {name!r}{suggest(name, SECTIONS)}; "
                              f"expected some of {', '.join(SECTIONS)}")
    if not names:
        raise ConfigError(f"--sections: name at least one of {', '.join(SECTIONS)}")
    return tuple(s for s in SECTIONS if s in names)


def measurements_of(path: str | Path, doc: Record, purpose: str) -> list[Record]:
    """The raw measurements of the calibration file ``doc`` read from ``path``; ConfigError
    when it has none (``purpose``: what they were wanted for, "fit" or "add")."""
    records = (doc.get("source") or {}).get("measurements") or []
    if not records:
        raise ConfigError(f"{path}: field 'source.measurements': no measurements to {purpose}")
    return records


def add_measurements(records: list[Record], files: list[tuple[str, Record]], gpu_name: str
                     ) -> tuple[list[Record], list[str]]:
    """``records`` with the measurements of each calibration file ``(path, doc)`` in ``files``
    that measured something ``records`` did not (same
    :func:`~ccoverlap.calibrate.grids.record_key`), and a note per file. A file of another GPU,
    or one without measurements, is a ConfigError."""
    from ccoverlap.calibrate.grids import record_key

    out = list(records)
    notes: list[str] = []
    seen = {record_key(r) for r in out}
    for path, doc in files:
        if doc["gpu"] != gpu_name:
            raise ConfigError(f"{path}: measured as GPU {doc['gpu']!r}, but these parameters are for {gpu_name!r}")
        extra = [r for r in measurements_of(path, doc, "add") if record_key(r) not in seen]
        seen.update(record_key(r) for r in extra)
        out += extra
        notes.append(f"{len(extra)} measurements added from {path}")
    return out, notes


def slug(name: str) -> str:
    """File-name form of a GPU name: ``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s or "gpu"


def _log(quiet: bool) -> Log:
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        if not quiet:
            sys.stderr.write(f"[{time.perf_counter() - t0:7.1f}s] {msg}\n")
            sys.stderr.flush()

    return log


def _resolve_gpu(name: str | None, device_name: str) -> GPUSpec:
    from ccoverlap.catalog.hardware import GPUS, get_gpu

    if name:
        return get_gpu(name)
    raise ConfigError(f"GPU {device_name!r} is not in the catalog ({', '.join(GPUS)}); "
                      "pass --gpu NAME with the closest catalog entry")


def _measure(args: argparse.Namespace, log: Log, sections: tuple[str, ...], checkpoint: Checkpoint | None = None
             ) -> tuple[list[Record], list[str], Record, Record, GPUSpec]:
    from ccoverlap.calibrate import grids, microbench
    from ccoverlap.calibrate.suite import run_suite

    dev = microbench.require_cuda(args.device)  # one-line ConfigError without CUDA
    import torch

    info = microbench.device_info(dev)
    gpu = _resolve_gpu(args.gpu or info["catalog_gpu"], info["name"])
    notes: list[str] = []
    if info["sms"] != gpu.sms:
        notes.append(f"device has {info['sms']} SMs, catalog GPU {gpu.name} {gpu.sms}: the fit uses the catalog's")
    free, _total = torch.cuda.mem_get_info(dev)
    grid = grids.make_grid(args.quick, memory_bytes=free)
    log(f"calibrating {info['name']} (as {gpu.name}), driver {info['driver']}, torch {info['torch']}, "
        f"CUDA {info['cuda']}; {'quick' if args.quick else 'full'} plan")
    plan = {"quick": grid.quick, "reps": grid.reps, "warmup": grid.warmup, "min_window_s": grid.min_window_s,
            "statistic": "median of reps", "timing": "CUDA events around loops of back-to-back launches"}

    def keep(records: list[Record], run_notes: list[str], settings: Record) -> None:
        if checkpoint is not None:
            checkpoint(list(records), notes + run_notes, dict(settings, **plan, partial=True), info, gpu)

    records, run_notes, settings = run_suite(dev, grid, log=log, kernel_prefer=args.kernel, checkpoint=keep,
                                             sections=sections)
    settings.update(plan, sections=list(sections))
    return records, notes + run_notes, settings, info, gpu


def _fit_and_report(records: list[Record], gpu: GPUSpec, log: Log
                    ) -> tuple[CalibrationFit, list[Record], list[Record], list[Record]]:
    from ccoverlap.calibrate import fit as F
    from ccoverlap.cost.params import default_params

    log(f"fitting {len(records)} measurements ...")
    result = F.fit(records, gpu, default_params(gpu, sustained=False))  # microbenchmarks: their own clock
    held = F.heldout_errors(result, gpu)
    train = F.heldout_errors(result, gpu, held_out=False)
    decomposition = F.decomposition_table(result, gpu)
    return result, held, train, decomposition


def _rows(rows: list[Record], columns: list[tuple[str, str, str]]) -> list[list[str]]:
    """Cells of ``rows``: ``columns`` are (key, header, format spec)."""
    return [[format(r[k], f) if f else str(r[k]) for k, _, f in columns] for r in rows]


def print_report(result: CalibrationFit, held: list[Record], decomposition: list[Record], base: CostParams, path: Path,
                 out: IO[str] | None = None) -> None:
    """The fitted parameters (default -> fitted), the held-out error table and the
    decomposition-loss comparison (ficco Fig. 7), on ``out`` (default stdout), every cell whole
    at any width (:func:`ccoverlap.console.print_table`)."""
    from ccoverlap.console import Col, make_console, print_table, print_wrapped

    con = make_console(out, highlight=False)
    tables = [
        ("fitted cost parameters:", [{"name": k, "default": getattr(base, k), "fitted": v}
                                     for k, v in sorted(result.params.items())],
         [("name", "parameter", ""), ("default", "default", ".4g"), ("fitted", "fitted", ".4g")]),
        ("model error on held-out measurements (|predicted/measured - 1|):", held,
         [("group", "group", ""), ("n", "n", "d"), ("median_rel_err", "median", ".1%"), ("p90_rel_err", "p90", ".1%"),
          ("max_rel_err", "max", ".1%")]),
        ("decomposition loss (split time / whole time, ficco Fig. 7):", decomposition,
         [("name", "gemm", ""), ("dim", "dim", ""), ("ways", "ways", "d"), ("measured", "measured", ".3f"),
          ("predicted", "predicted", ".3f"), ("set", "used for", "")]),
    ]
    for title, rows, columns in tables:
        if rows:
            cols = [Col(h, "left" if i == 0 or not f else "right") for i, (_, h, f) in enumerate(columns)]
            print_table(con, cols, _rows(rows, columns), title=title)
            con.print()
    for note in result.notes:
        print_wrapped(con, f"note: {note}")
    print_wrapped(con, f"wrote {path}")
    print_wrapped(con, f"use it: ccoverlap plan --calibration {path}  (compare with plain `ccoverlap plan`)")


SPLIT = "held out: CRC-32 of the record's configuration divisible by 4"


def _target(args: argparse.Namespace, gpu: GPUSpec) -> Path:
    """The calibration file's path: ``--out`` itself when it ends in .json, else DIR/<gpu>.json."""
    path = Path(args.out or "calibrations")
    return path if path.suffix.lower() == ".json" else path / f"{slug(gpu.name)}.json"


def _common(records: list[Record], settings: Record, device: Record, gpu: GPUSpec) -> Record:
    from ccoverlap.version import __version__

    created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return dict(gpu=gpu.name, device=device, settings=settings, measurements=records, created=created,
                tool=f"ccoverlap calibrate {__version__}")


def _write_unfitted(args: argparse.Namespace, records: list[Record], notes: list[str], settings: Record, device: Record,
                    gpu: GPUSpec) -> None:
    """Write the measurements with no fit yet (``--refit FILE`` fits them later); a record the
    format rejects still leaves everything in ``<stem>.raw.json``."""
    from ccoverlap.calibrate import fileformat
    from ccoverlap.outputs import write_text

    path = _target(args, gpu)
    first = fileformat.build(params={}, fit_error=None, fit={}, heldout=[], train=[], decomposition=[],
                             notes=list(notes) + ["fit not done yet"],
                             **_common(records, dict(settings, split=SPLIT), device, gpu))
    try:
        fileformat.write(path, first)
    except ConfigError as exc:
        raw = path.with_name(path.stem + ".raw.json")
        write_text(raw, json.dumps(first, indent=1, default=str) + "\n")
        raise ConfigError(f"{exc} (raw measurements kept in {raw})") from None


def run(args: argparse.Namespace) -> int:
    """Measure (or, with ``--refit``, read the measurements of a file), fit, print the report,
    write the calibration file; 0 on success. User errors raise ConfigError (exit 2)."""
    from ccoverlap.calibrate import fileformat
    from ccoverlap.cost.params import default_params
    from ccoverlap.outputs import check_out_dir, check_out_file

    out = args.out or "calibrations"  # checked before the minutes of measuring
    (check_out_file if out.lower().endswith(".json") else check_out_dir)(out, "--out")
    log = _log(args.quiet)
    sections = parse_sections(args.sections)  # a misspelt section or an unreadable --add file fails
    added = [(f, fileformat.read(f)) for f in args.add]  # before any measuring
    if args.refit:
        old = fileformat.read(args.refit)
        src = old.get("source") or {}
        records = measurements_of(args.refit, old, "fit")
        from ccoverlap.catalog.hardware import get_gpu

        gpu = get_gpu(args.gpu or old["gpu"])
        device = src.get("device", {})
        settings = dict(src.get("settings", {}), refit_of=str(args.refit))
        notes = list(settings.get("measurement_notes", []))
    else:
        def checkpoint(recs: list[Record], run_notes: list[str], run_settings: Record, info: Record,
                       run_gpu: GPUSpec) -> None:
            _write_unfitted(args, recs, run_notes + ["measurements so far: the run had not finished when this was written"],
                            run_settings, info, run_gpu)

        records, notes, settings, device, gpu = _measure(args, log, sections, checkpoint)
        settings["measurement_notes"] = list(notes)
    settings["split"] = SPLIT
    if not args.refit:  # keep the measurements even if the fit fails: `--refit` can redo it
        _write_unfitted(args, records, notes, settings, device, gpu)
    if added:
        records, added_notes = add_measurements(records, added, gpu.name)
        notes, settings["added_from"] = notes + added_notes, [str(f) for f in args.add]
    path, common = _target(args, gpu), _common(records, settings, device, gpu)
    result, held, train, decomposition = _fit_and_report(records, gpu, log)
    from ccoverlap.calibrate.fit import overall_error

    data = fileformat.build(params=result.params, fit_error=overall_error(held), fit=result.stages, heldout=held,
                            train=train, decomposition=decomposition, notes=notes + result.notes, **common)
    fileformat.write(path, data)
    if args.json:
        json.dump({"file": str(path), "gpu": gpu.name, "params": result.params, "fit_error": overall_error(held),
                   "heldout": held, "notes": result.notes}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    print_report(result, held, decomposition, default_params(gpu, sustained=False), path)
    return 0
