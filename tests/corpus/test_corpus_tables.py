"""The corpus table format: metadata checked, rows read, the declared split stable."""

import pytest

from ccoverlap.corpus.tables import SPLITS, load_table, table_names
from ccoverlap.errors import ConfigError

META = """source: {repository: example/bench, path: data/t.csv, commit: abc123, licence: MIT}
hardware: 8 x H100 SXM
gpu: H100-SXM
units: {nbytes: bytes, time_s: s}
split_key: [op, nbytes]
"""


def _write(root, meta=META, rows="op,nbytes,time_s\nall_reduce,1024,1e-5\nall_reduce,2048,2e-5\nall_gather,1024,9e-6\n"):
    d = root / "collective"
    d.mkdir(parents=True, exist_ok=True)
    (d / "t.yaml").write_text(meta)
    (d / "t.csv").write_text(rows)


def test_table_reads_rows_numbers_and_source(tmp_path):
    _write(tmp_path)
    t = load_table("collective", "t", root=tmp_path)
    assert t.gpu == "H100-SXM" and t.source.licence == "MIT"
    assert t.rows[1] == {"op": "all_reduce", "nbytes": 2048.0, "time_s": 2e-5}
    assert "example/bench data/t.csv@abc123 (MIT)" == t.source.cite()
    assert table_names("collective", root=tmp_path) == ["t"]


def test_split_is_declared_by_key_and_covers_every_row(tmp_path):
    _write(tmp_path, rows="op,nbytes,time_s\n" + "".join(f"ar,{2**i},{i}\n" for i in range(64)))
    t = load_table("collective", "t", root=tmp_path)
    fit, held = t.half("fit"), t.half("held-out")
    assert len(fit) + len(held) == 64 and 16 < len(fit) < 48
    # the half of a row depends on its key only, not on the other columns or the row order
    row = dict(held[0], time_s=123.0)
    assert t.split_of(row) == "held-out"
    assert {t.split_of(r) for r in t.rows} == set(SPLITS)


@pytest.mark.parametrize("meta, rows, message", [
    (META.replace("licence: MIT", "licence: ''"), None, "source lacks licence"),
    (META.replace("split_key: [op, nbytes]", "split_key: [size]"), None, "split_key must name columns"),
    (META + "colour: red\n", None, "unknown field 'colour'"),
    (META, "op,nbytes,time_s\n", "has no rows"),
    (META, "op,nbytes,time_s\nar,1\n", "expected 3 columns"),
])
def test_bad_table_is_one_clear_error(tmp_path, meta, rows, message):
    _write(tmp_path, meta, rows) if rows is not None else _write(tmp_path, meta)
    with pytest.raises(ConfigError, match=message):
        load_table("collective", "t", root=tmp_path)


def test_unknown_table_names_the_known_ones(tmp_path):
    _write(tmp_path)
    with pytest.raises(ConfigError, match=r"no corpus table 'x' .*known: t"):
        load_table("collective", "x", root=tmp_path)
