"""Writing the user's files (ccoverlap.outputs): one file or a set atomically, the user's files
as they were after any failure, and output paths checked before the work."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccoverlap.config import clip_line
from ccoverlap.errors import ConfigError
from ccoverlap.outputs import (
    atomic_dir,
    atomic_file,
    check_out_dir,
    check_out_file,
    path_name,
    write_files,
    write_text,
)


def _listing(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "nccl.env"
    target.write_text("OLD=1\n")
    write_text(target, "NEW=1\n")
    assert target.read_text() == "NEW=1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["nccl.env"]
    mode = stat.S_IMODE(target.stat().st_mode)
    assert mode & 0o044 == 0o044 or mode == 0o666 & ~_umask()  # readable like any new file, not 0600


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_failure_while_writing_leaves_the_old_file(tmp_path):
    target = tmp_path / "calibration.json"
    target.write_text("{}\n")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as tmp:
            tmp.write_text("half a fi")
            raise RuntimeError("the writer failed")
    assert target.read_text() == "{}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]


def test_a_set_is_written_all_or_none(tmp_path):
    out = tmp_path / "emit"
    out.mkdir()
    (out / "nccl.env").write_text("MINE=1\n")
    (out / "notes.txt").write_text("the user's own file\n")
    before = _listing(out)
    with pytest.raises(ConfigError):
        with atomic_dir(out) as tmp:
            (tmp / "nccl.env").write_text("NCCL_ALGO=Ring\n")
            (tmp / "a.csv").write_text("x\n")
            raise ConfigError("building the third file failed")
    assert _listing(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["emit"]  # no temporary directory left
    paths = write_files(out, {"nccl.env": "NCCL_ALGO=Ring\n", "sub/rank-0.json": b"{}"})
    assert [p.name for p in paths] == ["nccl.env", "rank-0.json"]
    assert _listing(out) == {"nccl.env": "NCCL_ALGO=Ring\n", "notes.txt": "the user's own file\n",
                             "sub/rank-0.json": "{}"}


def test_a_set_that_cannot_be_moved_into_place_changes_nothing(tmp_path):
    out = tmp_path / "emit"
    (out / "README.md").mkdir(parents=True)  # a directory where a file of the set goes
    (out / "nccl.env").write_text("MINE=1\n")
    with pytest.raises(ConfigError, match="README.md: is a directory"):
        write_files(out, {"nccl.env": "NEW=1\n", "README.md": "new\n"})
    assert (out / "nccl.env").read_text() == "MINE=1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emit"]


def test_checks_name_what_cannot_be_written(tmp_path, unwritable_dir):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        check_out_dir(afile, "--out")
    with pytest.raises(ConfigError, match="is not a directory"):
        check_out_file(afile / "x.png", "--png")
    with pytest.raises(ConfigError, match="is a directory, expected a file name"):
        check_out_file(tmp_path, "--png")
    with pytest.raises(ConfigError, match="^--out .*: cannot create it"):
        check_out_dir(unwritable_dir / "new", "--out")
    with pytest.raises(ConfigError, match="^--png .*: cannot write there"):
        check_out_file(unwritable_dir / "x.png", "--png")
    check_out_dir(tmp_path / "a" / "b", "--out")  # creatable: passes, and makes nothing
    check_out_file(tmp_path / "c" / "x.png", "--png")
    check_out_dir(None, "--out")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "read-only") == ["afile"]


def test_long_and_odd_paths_are_one_short_error():
    long = "/tmp/" + "a/" * 2100 + "x"
    with pytest.raises(ConfigError) as e:
        check_out_dir(long, "--out")
    assert "path too long" in str(e.value) and len(str(e.value)) < 200
    with pytest.raises(ConfigError, match="NUL"):
        check_out_file("a\x00b.png", "--png")
    assert "..." in path_name("x" * 5000) and len(path_name("x" * 5000)) < 60


# ----------------------------------------------------------------------------- fuzz

NAMES = st.text(alphabet="abcdefghij_-.", min_size=1, max_size=12).filter(lambda n: n not in (".", ".."))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(NAMES, st.binary(max_size=64), min_size=1, max_size=6),
       fail_at=st.integers(min_value=0, max_value=6))
def test_a_set_is_all_or_none_whatever_fails(tmp_path_factory, files, fail_at):
    out = tmp_path_factory.mktemp("set") / "out"
    out.mkdir()
    (out / "mine.txt").write_text("mine\n")
    for name in list(files)[:2]:
        (out / name).write_bytes(b"old")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    try:
        with atomic_dir(out) as tmp:
            for i, (name, data) in enumerate(files.items()):
                if i == fail_at:
                    raise ConfigError("failed half-way")
                (tmp / name).write_bytes(data)
    except ConfigError:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == {**before, **files}
    assert [p.name for p in out.parent.iterdir()] == ["out"]


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=3000), limit=st.integers(min_value=20, max_value=600))
def test_clip_line_is_one_line_within_the_limit(text, limit):
    line = clip_line(text, limit)
    assert "\n" not in line and len(line) <= limit
    if len(text) <= limit and "\n" not in text:
        assert line == text


def test_a_replaced_file_keeps_its_mode(tmp_path):
    target = tmp_path / "nccl.env"
    target.write_text("OLD=1\n")
    target.chmod(0o600)
    write_text(target, "NEW=1\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
