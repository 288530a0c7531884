"""Hardware catalog and user-supplied GPU / cluster files."""

import json

import pytest

from ccoverlap.catalog.hardware import GPUS, get_cluster, get_gpu, load_cluster_file
from ccoverlap.errors import ConfigError

REQUIRED = ("H100-SXM", "H200", "A100-80GB-SXM", "A40", "MI300X")


def test_catalog_has_required_gpus_with_plausible_numbers():
    for name in REQUIRED:
        g = GPUS[name]
        assert g.sms > 0 and g.copy_engines > 0
        assert g.peak_flops["bf16"] > g.peak_flops["fp32"]
        assert 0.5e12 < g.hbm_bytes_per_s < 10e12
        assert g.source


def test_lookup_is_case_insensitive_and_unknown_names_are_listed():
    assert get_gpu("h100").name == "H100-SXM"
    assert get_cluster("A40", nodes=2).world_size == 16
    with pytest.raises(ConfigError, match="unknown GPU 'B300'.*H100-SXM"):
        get_gpu("B300")


def test_user_cluster_file_toml_and_json(tmp_path):
    c = load_cluster_file("examples/my-cluster.toml")
    assert c.world_size == 32 and c.inter.fabric == "roce" and c.gpu.name == "H100-SXM"
    data = {"cluster": {"name": "x", "nodes": 1, "gpus_per_node": 4,
                        "gpu": {"name": "G", "vendor": "nvidia", "sms": 10,
                                "peak_flops": {"bf16": 1e14, "fp16": 1e14, "fp32": 1e13},
                                "hbm_bytes_per_s": 1e12, "memory_bytes": 1e10, "l2_bytes": 1e6,
                                "copy_engines": 2},
                        "intra": {"fabric": "pcie", "bandwidth_bytes_per_s": 3e10, "latency_s": 3e-6},
                        "inter": {"fabric": "ethernet", "bandwidth_bytes_per_s": 1e9, "latency_s": 1e-5}}}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(data))
    c = load_cluster_file(p)
    assert c.gpu.sms == 10 and c.world_size == 4


@pytest.mark.parametrize("text,suffix,match", [
    ("{not json", ".json", "not valid JSON"),
    ("a = [", ".toml", "not valid TOML"),
    ("name: x\nnodes: 1\n", ".yaml", "missing field 'intra'|gpu"),
    ('{"name": "x", "nodes": -1, "gpus_per_node": 8, "gpu": "A40", '
     '"intra": {"fabric": "pcie", "bandwidth_bytes_per_s": 1, "latency_s": 0}, '
     '"inter": {"fabric": "infiniband", "bandwidth_bytes_per_s": 1, "latency_s": 0}}', ".json", "nodes"),
    ('{"name": "x", "nodes": 1, "gpus_per_node": 8, "gpu": "A40", "colour": 1, '
     '"intra": {"fabric": "pcie", "bandwidth_bytes_per_s": 1, "latency_s": 0}, '
     '"inter": {"fabric": "infiniband", "bandwidth_bytes_per_s": 1, "latency_s": 0}}', ".json", "colour"),
    ("x", ".ini", "unknown config format"),
])
def test_malformed_cluster_files_name_the_problem(tmp_path, text, suffix, match):
    p = tmp_path / f"bad{suffix}"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match) as exc:
        load_cluster_file(p)
    assert str(p) in str(exc.value)


def test_power_limited_h100_peak_interpolates_the_two_datasheets():
    """[PCAP]: the power law through H100 SXM (700 W, 989.4) and H100 NVL (400 W, 835.5 dense bf16)."""
    import math

    from ccoverlap.catalog.hardware import power_limited_peak

    assert power_limited_peak(989.4e12, 700.0) == 989.4e12
    assert math.isclose(power_limited_peak(989.4e12, 400.0), 835.5e12, rel_tol=1e-12)
    a = math.log(989.4 / 835.5) / math.log(700 / 400)
    assert math.isclose(power_limited_peak(989.4e12, 500.0), 989.4e12 * (500 / 700) ** a, rel_tol=1e-12)
    g = get_gpu("H100-96GB-HBM2e-500W")
    assert 835.5e12 < g.peak_flops["bf16"] < 989.4e12  # "between SXM and NVL"
    assert math.isclose(g.peak_flops["fp8"] / g.peak_flops["bf16"], 1978.9 / 989.4, rel_tol=1e-9)
    assert g.hbm_bytes_per_s == 2.4e12 and g.memory_bytes == 96e9
