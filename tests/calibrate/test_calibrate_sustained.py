"""The ``sustained`` section of ``ccoverlap calibrate``: the clock share from a long GEMM loop's
windows (the sweep's short loops, or the first windows, over the last third), its place in the fit's parameters (not in the
model the other sections are checked with), its record format, and (with CUDA) the loop."""

import pytest

from ccoverlap.calibrate import fileformat
from ccoverlap.calibrate import fit as F
from ccoverlap.calibrate.sustained import EARLY_WINDOWS, MIN_WINDOWS, sustained_fraction
from ccoverlap.catalog.hardware import GPUS
from ccoverlap.cost.params import default_params
from ccoverlap.errors import ConfigError


def record(times, clocks=None):
    return {"kind": "sustained", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "seconds": 40.0,
            "iters_per_window": 200, "window_time_s": list(times),
            "sm_clock_mhz": list(clocks) if clocks is not None else [None] * len(times)}


def test_fraction_is_first_windows_over_last_third():
    # 3 cool windows at 1.00 ms, a ramp, then a settled 1.25 ms: the last third (5 of 15) is settled
    times = [1.00e-3] * 3 + [1.05e-3, 1.10e-3, 1.15e-3, 1.20e-3, 1.22e-3, 1.24e-3, 1.25e-3] + [1.25e-3] * 5
    clocks = [1980.0] * 3 + [1900.0] * 7 + [1584.0] * 5
    info, notes = sustained_fraction([{"kind": "gemm"}, record(times, clocks)])
    assert notes == []
    assert info["sustained_clock_fraction"] == pytest.approx(0.8)
    assert (info["early_s"], info["late_s"], info["windows"]) == (1.00e-3, 1.25e-3, 15)
    assert (info["clock_early_mhz"], info["clock_late_mhz"]) == (1980.0, 1584.0)


def test_a_gpu_that_settles_within_the_first_window_is_judged_against_the_sweeps_short_loops():
    # the loop is flat (already at the power limit in its first 0.25 s window); the sweep's short
    # loops of the same GEMM ran at 1.00 ms: the sustained share is 1.00 / 1.15, not 1
    flat = [1.15e-3] * 12
    sweep = {"kind": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "time_s": 1.00e-3}
    other = sweep | {"m": 4096, "time_s": 0.4e-3}
    info, notes = sustained_fraction([other, sweep, record(flat)])
    assert notes == [] and info["early_from"] == "the sweep's short loops"
    assert info["sustained_clock_fraction"] == pytest.approx(1.00 / 1.15)
    assert info["first_windows_s"] == pytest.approx(1.15e-3)
    alone, _ = sustained_fraction([other, record(flat)])  # no sweep record of the shape: first windows
    assert alone["sustained_clock_fraction"] == 1.0 and alone["early_from"] == "the first windows"


def test_too_short_or_faster_later_or_absent():
    info, notes = sustained_fraction([record([1e-3] * (MIN_WINDOWS - 1))])
    assert info is None and "fewer than" in notes[0]
    info, notes = sustained_fraction([record([1.1e-3] * EARLY_WINDOWS + [1.0e-3] * 9)])
    assert info["sustained_clock_fraction"] == 1.0 and "faster" in notes[0]
    assert sustained_fraction([{"kind": "gemm"}]) == (None, [])


def test_fit_writes_it_to_the_calibration_but_checks_the_rest_at_the_measured_clock():
    gpu = GPUS["H100-SXM"]
    times = [1.00e-3] * 3 + [1.25e-3] * 9
    result = F.fit([record(times)], gpu, default_params(gpu, sustained=False))
    assert result.params["sustained_clock_fraction"] == pytest.approx(0.8)
    assert result.stages["sustained"]["values"] == {"sustained_clock_fraction": pytest.approx(0.8)}
    assert result.cost_params.sustained_clock_fraction == 1.0  # the held-out checks use the cool clock


def test_record_format_checked_with_field_names():
    fileformat.validate_measurement(record([1e-3] * 12), "calib.json", "source.measurements[0]")
    for bad in ([], [1e-3, -1.0], "fast"):
        with pytest.raises(ConfigError, match=r"source.measurements\[0\].window_time_s"):
            fileformat.validate_measurement(record([1e-3]) | {"window_time_s": bad}, "calib.json",
                                            "source.measurements[0]")


@pytest.mark.gpu
def test_the_loop_on_a_gpu_records_windows():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from ccoverlap.calibrate import grids
    from ccoverlap.calibrate import microbench as mb
    from ccoverlap.calibrate.sustained import sustained_section

    bench = mb.Bench(torch.device("cuda"), grids.make_grid(True))
    notes = []
    (rec,) = sustained_section(bench, notes, seconds=2.0)
    fileformat.validate_measurement(rec, "gpu run", "record")
    assert len(rec["window_time_s"]) >= 4 and all(t > 0 for t in rec["window_time_s"])
    # an 8192^3 bf16 GEMM: 1.1 TFLOP per call, well under a second and over 0.1 ms on any datacenter GPU
    assert all(1e-4 < t < 1.0 for t in rec["window_time_s"])
