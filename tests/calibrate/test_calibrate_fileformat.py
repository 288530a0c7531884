"""The calibration file: round trip, accepted by CostParams.load (the planner's path), and
malformed files give one ConfigError naming the file and the field."""

import json

import pytest

from ccoverlap.calibrate import fileformat
from ccoverlap.calibrate import fit as F
from ccoverlap.catalog.hardware import CLUSTERS
from ccoverlap.cost import CostModel
from ccoverlap.cost.params import CostParams, default_params
from ccoverlap.errors import ConfigError
from ccoverlap.specs import GemmSpec


def make_file(noisy_fit, noisy_records, gpu):
    held = F.heldout_errors(noisy_fit, gpu)
    return fileformat.build(
        gpu=gpu.name, params=noisy_fit.params, fit_error=F.overall_error(held), notes=list(noisy_fit.notes),
        device={"name": "synthetic (model + 3% noise)", "driver": "n/a", "torch": "n/a", "cuda": "n/a"},
        settings={"quick": False, "synthetic": True}, fit=noisy_fit.stages, heldout=held,
        train=F.heldout_errors(noisy_fit, gpu, held_out=False), decomposition=F.decomposition_table(noisy_fit, gpu),
        measurements=noisy_records, created="2026-01-01T00:00:00Z", tool="test")


@pytest.fixture(scope="module")
def calib(noisy_fit, noisy_records, gpu):
    return make_file(noisy_fit, noisy_records, gpu)


def test_round_trip(tmp_path, calib):
    path = fileformat.write(tmp_path / "sub" / "h100.json", calib)
    assert path.is_file() and not (tmp_path / "sub" / "h100.json.tmp").exists()
    back = fileformat.read(path)
    assert back == json.loads(json.dumps(calib))
    assert back["source"]["measurements"] == calib["source"]["measurements"]
    assert back["version"] == fileformat.VERSION and back["source"]["format"] == fileformat.FORMAT


def test_planner_loads_it_and_gets_the_fitted_model(tmp_path, calib, noisy_fit, gpu):
    path = fileformat.write(tmp_path / "c.json", calib)
    loaded = CostParams.load(path, base=default_params(gpu))
    for name, value in noisy_fit.params.items():
        assert getattr(loaded, name) == pytest.approx(value, rel=1e-12), name
    # a calibration without a sustained-clock measurement keeps the GPU's default sustained clock
    fitted = noisy_fit.cost_params.with_overrides(sustained_clock_fraction=default_params(gpu).sustained_clock_fraction)
    assert loaded == fitted
    spec = GemmSpec(m=8192, n=8192, k=8192)
    cluster = CLUSTERS["dgx-h100"]
    assert CostModel(cluster, loaded).alone_s(spec) == CostModel(cluster, fitted).alone_s(spec)
    assert CostModel(cluster, loaded).alone_s(spec) != CostModel(cluster, default_params(gpu)).alone_s(spec)


def test_a_file_without_source_is_still_valid(tmp_path):
    data = {"version": 1, "gpu": "H100-SXM", "params": {"gemm_peak_fraction": 0.7}}
    assert fileformat.read(fileformat.write(tmp_path / "min.json", data)) == data


def _broken(calib, edit):
    data = json.loads(json.dumps(calib))
    edit(data)
    return data


CASES = [
    ("missing params", lambda d: d.pop("params"), "field 'params': missing"),
    ("params not a mapping", lambda d: d.update(params=[1, 2]), "field 'params': expected a mapping"),
    ("unknown param", lambda d: d["params"].update(gemm_peak_fractoin=0.7), "field 'params.gemm_peak_fractoin'"),
    ("param not a number", lambda d: d["params"].update(gemm_peak_fraction="fast"), "field 'params.gemm_peak_fraction'"),
    ("fraction above 1", lambda d: d["params"].update(gemm_peak_fraction=1.5),
     "field 'params.gemm_peak_fraction': cost parameter gemm_peak_fraction is a fraction, must be <= 1"),
    ("tile not integer", lambda d: d["params"].update(gemm_tile_m=100.5), "field 'params.gemm_tile_m'"),
    ("newer version", lambda d: d.update(version=99), "field 'version': file format version 99 is newer"),
    ("version not int", lambda d: d.update(version="1"), "field 'version'"),
    ("unknown top level", lambda d: d.update(extra=1), "field 'extra': unknown top-level field"),
    ("gpu missing", lambda d: d.pop("gpu"), "field 'gpu': missing"),
    ("negative fit error", lambda d: d.update(fit_error=-1), "field 'fit_error'"),
    ("notes not strings", lambda d: d.update(notes=[1]), "field 'notes'"),
    ("wrong format tag", lambda d: d["source"].update(format="other"), "field 'source.format'"),
    ("device name missing", lambda d: d["source"]["device"].pop("name"), "field 'source.device.name'"),
    ("measurement time negative", lambda d: d["source"]["measurements"][3].update(time_s=-1.0),
     "field 'source.measurements[3].time_s': expected a positive number"),
    ("measurement field missing", lambda d: d["source"]["measurements"][0].pop("m"),
     "field 'source.measurements[0].m': missing"),
    ("unknown kind", lambda d: d["source"]["measurements"][1].update(kind="gemv"),
     "field 'source.measurements[1].kind'"),
    ("bad dtype", lambda d: d["source"]["measurements"][0].update(dtype="fp8"),
     "field 'source.measurements[0].dtype'"),
    ("victim without k", lambda d: next(r for r in d["source"]["measurements"] if r["kind"] == "sm_contention")["victim"].pop("k"),
     ".victim.k': missing"),
]


@pytest.mark.parametrize("what,edit,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_files_name_file_and_field(tmp_path, calib, what, edit, expected):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_broken(calib, edit)))
    with pytest.raises(ConfigError) as exc:
        fileformat.read(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ") and expected in msg, msg
    assert "\n" not in msg


def test_not_json_names_file_and_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"version": 1,\n "params": {')
    with pytest.raises(ConfigError, match=r"broken\.json: not valid JSON: line 2 column"):
        fileformat.read(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.json: no such calibration file"):
        fileformat.read(tmp_path / "nope.json")


def test_write_refuses_invalid_data_and_leaves_nothing(tmp_path, calib):
    bad = _broken(calib, lambda d: d["source"]["measurements"][0].update(time_s=float("nan")))
    with pytest.raises(ConfigError, match=r"measurements\[0\]\.time_s"):
        fileformat.write(tmp_path / "x.json", bad)
    assert not list(tmp_path.iterdir())


def test_costparams_load_accepts_every_top_level_key_we_write(calib):
    """CostParams.load rejects unknown top-level keys: everything we write must be in its list."""
    assert set(calib) == set(fileformat.TOP_LEVEL)


def test_a_chunked_copy_engine_record_has_a_whole_positive_chunk_size():
    rec = {"kind": "ce_contention", "victim": {"op": "memory", "bytes": 1e9}, "direction": "d2d", "bytes": 2.0 ** 26,
           "victim_alone_s": 1e-3, "victim_s": 1.1e-3, "copy_alone_s": 5e-4, "copy_s": 6e-4}
    fileformat.validate_measurement(rec, "c.json", "source.measurements[0]")  # whole copies: no chunk field
    fileformat.validate_measurement(rec | {"chunk_bytes": 65536}, "c.json", "source.measurements[0]")
    for bad in (0, 1.5, "64K"):
        with pytest.raises(ConfigError, match=r"source\.measurements\[0\]\.chunk_bytes"):
            fileformat.validate_measurement(rec | {"chunk_bytes": bad}, "c.json", "source.measurements[0]")
