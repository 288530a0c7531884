"""Engines and trace sources without Ray: fsspec URLs give the same analysis as local paths, the
layout search's batched branch and bound gives the serial result, a local run imports neither
Ray nor fsspec, and asking for Ray where it is not installed is one line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from ccoverlap.cli import main
from ccoverlap.errors import ConfigError
from ccoverlap.planning.search import Candidate, _simulate_in_order
from ccoverlap.trace.analyze import analyze
from ccoverlap.workers.pool import LocalEngine, SerialEngine, make_engine

fsspec = pytest.importorskip("fsspec")

JOBS = [FIXTURES / "gloo_2rank", FIXTURES / "gloo_tpdp_4rank", FIXTURES / "synthetic" / "two_steps"]


def _same_but_files(local: dict, remote: dict, local_prefix: str, remote_prefix: str) -> bool:
    """The two JSON documents are equal once each file's location is written the same way."""
    a = json.dumps(local, sort_keys=True).replace(local_prefix, "<job>/")
    b = json.dumps(remote, sort_keys=True).replace(remote_prefix, "<job>/")
    return a == b


def _to_memory(d: Path, name: str) -> str:
    for f in sorted(d.iterdir()):
        if f.is_file():
            with fsspec.open(f"memory://{name}/{f.name}", "wb") as fh:
                fh.write(f.read_bytes())
    return f"memory://{name}"


@pytest.mark.parametrize("job", JOBS, ids=lambda p: p.name)
def test_memory_urls_give_the_local_analysis(job):
    url = _to_memory(job, f"engine-{job.name}")
    ref = analyze([job], engine=SerialEngine()).to_dict()
    for engine in (SerialEngine(), LocalEngine(2)):   # forked workers see the parent's memory store
        got = analyze([url], engine=engine).to_dict()
        assert got["files"] and all(f.startswith("memory:///") for f in got["files"])
        assert _same_but_files(ref, got, f"{job}/", f"memory:///engine-{job.name}/")


def test_file_urls_give_the_local_analysis():
    job = FIXTURES / "gloo_tpdp_4rank"
    ref = analyze([job]).to_dict()
    got = analyze([f"file://{job}"]).to_dict()
    assert _same_but_files(ref, got, f"{job}/", f"file://{job}/")
    one = analyze([f"file://{job}/{sorted(p.name for p in job.iterdir())[0]}"])
    assert len(one.ranks) == 1


def test_bad_urls_are_one_line_each():
    url = _to_memory(FIXTURES / "gloo_2rank", "engine-bad")
    with fsspec.open("memory://engine-bad/broken.json", "wb") as fh:
        fh.write(b'{"traceEvents": [')
    a = analyze([url, "memory://engine-missing/x.json", "nosuchscheme://x/y.json"])
    assert len(a.ranks) == 2
    text = "\n".join(a.problems)
    assert "memory://engine-missing/x.json: no such file or directory" in text
    assert "nosuchscheme://x/y.json: Protocol not known: nosuchscheme" in text
    assert "memory:///engine-bad/broken.json: truncated or invalid JSON" in text
    assert all("\n" not in p for p in a.problems)


def test_object_store_without_its_fsspec_extra_names_the_package():
    pytest.importorskip("fsspec.implementations.local")
    try:
        import s3fs  # noqa: F401
        pytest.skip("s3fs is installed")
    except ImportError:
        pass
    with pytest.raises(Exception) as err:
        analyze(["s3://bucket/job/"])
    assert "s3fs" in str(err.value) and "\n" not in str(err.value)


def test_local_run_imports_neither_ray_nor_fsspec(tmp_path):
    code = ("import sys, contextlib, io\n"
            "from ccoverlap.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['analyze', {str(JOBS[0])!r}, '--json', '-q']) == 0\n"
            "    assert main(['plan', '--search', '--json', '--no-png', '--model', 'phi-2', '--cluster', 'dgx-h100',"
            " '--nodes', '1', '--global-batch', '16', '--seq-len', '2048', '--max-simulations', '1', '--top', '0',"
            " '--out', sys.argv[1]]) == 0\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'fsspec')))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_engine_ray_without_ray_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)    # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "ccoverlap.workers.ray_cluster", raising=False)
    assert main(["analyze", str(JOBS[0]), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert err == "ccoverlap analyze: error: --engine ray needs Ray: pip install 'ccoverlap[ray]'\n"


def test_engine_options_that_do_not_fit():
    with pytest.raises(ConfigError, match="--address is for --engine ray"):
        make_engine("local", address="127.0.0.1:6379")
    with pytest.raises(ConfigError, match="--jobs is for the local engine"):
        make_engine("ray", jobs=2)
    with pytest.raises(ConfigError, match="unknown engine 'spark'"):
        make_engine("spark")


# ----------------------------------------------------------------------------- the layout search

def _cands(estimates):
    return [Candidate(parallel=None, batch=None, label=f"L{i}", memory_bytes=0.0, fits=True, estimate_s=e)
            for i, e in enumerate(estimates)]


def _run(estimates, results, width, max_simulations):
    """The branch and bound over fake layouts whose simulated numbers are ``results``."""
    cands = _cands(estimates)
    asked = []

    def simulate(batch):
        asked.extend(batch)
        return [(results[j], 1.0, 0.5, 0.0, fits) for j, fits in ((int(b.split()[0]), b.endswith("ok")) for b in batch)]

    jobs = [f"{j} {'ok' if j != 1 else 'too big'}" for j in range(len(cands))]   # layout 1 does not fit
    notes: list[str] = []
    counts = _simulate_in_order(cands, jobs, simulate, width, max_simulations, notes, None, 0)
    return counts, [c.step_time_s for c in cands], notes, asked


@pytest.mark.parametrize("width", [2, 3, 4, 8])
def test_batched_branch_and_bound_gives_the_serial_result(width):
    estimates = [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    # layout 1 (does not fit) would be fastest; 2 sets the bound at 2.5 -> 3.0 and later are pruned
    results = [4.0, 1.0, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]
    serial = _run(estimates, results, 1, 24)
    assert serial[0] == (3, 5, 1) and serial[1][3:] == [None] * 5   # 3 simulated, 5 pruned, 1 under its estimate
    wide = _run(estimates, results, width, 24)
    assert wide[:3] == serial[:3]
    assert len(wide[3]) >= len(serial[3])      # speculative simulations, dropped past the stop
    capped = _run(estimates, [9.0] * 8, width, 4)
    assert capped[:3] == _run(estimates, [9.0] * 8, 1, 4)[:3]
    assert capped[0] == (4, 0, 0) and "stopped after 4 simulations; 4 fitting layouts" in capped[2][0]


# ----------------------------------------------------------------------------- the local engine

def _json(analysis) -> str:
    from ccoverlap.trace.report_json import write_json

    out = io.StringIO()
    write_json(analysis, out)
    return out.getvalue()


@pytest.mark.parametrize("job", [FIXTURES / "synthetic" / "two_steps", FIXTURES / "gloo_tpdp_4rank"],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("jobs", [2, 3])
def test_ranks_in_worker_processes_give_the_serial_output_byte_for_byte(job, jobs):
    assert _json(analyze([job], engine=LocalEngine(jobs))) == _json(analyze([job], engine=SerialEngine()))


def _square_or_fail(x: int) -> int:
    if x == 7:
        raise ValueError("item 7 is bad")
    return x * x


def _die_in_a_worker(item: tuple[int, int, int]) -> int:
    parent, code, x = item
    if os.getpid() != parent:
        os._exit(code)       # as if the kernel had killed the worker (3), or it left without a word (0)
    time.sleep(0.05)         # the parent is slow enough that the workers claim items too
    return x


def test_local_engine_keeps_item_order_and_raises_a_worker_error():
    assert list(LocalEngine(3).map(_square_or_fail, range(7))) == [x * x for x in range(7)]
    assert list(LocalEngine(2).map(_square_or_fail, [])) == []
    with pytest.raises(ValueError, match="item 7 is bad"):
        list(LocalEngine(3).map(_square_or_fail, range(20)))


def test_a_worker_that_dies_is_an_error_not_a_hang():
    with pytest.raises(RuntimeError, match="worker process ended with exit code 3"):
        list(LocalEngine(2).map(_die_in_a_worker, [(os.getpid(), 3, x) for x in range(20)]))
    with pytest.raises(RuntimeError, match="ended without returning every result"):
        list(LocalEngine(2).map(_die_in_a_worker, [(os.getpid(), 0, x) for x in range(20)]))


def _big_result(x: int) -> bytes:
    if os.getpid() == int(os.environ["CCOVERLAP_TEST_PARENT"]):
        time.sleep(0.2)      # the parent is busy while the workers send results larger than a pipe holds
    return bytes([x]) * (3 << 20)


def test_results_larger_than_a_pipe_come_back_whole(monkeypatch):
    monkeypatch.setenv("CCOVERLAP_TEST_PARENT", str(os.getpid()))
    got = list(LocalEngine(3).map(_big_result, range(9)))
    assert [len(r) for r in got] == [3 << 20] * 9
    assert [r[0] for r in got] == list(range(9)) and [r[-1] for r in got] == list(range(9))


def _in_fresh_python(code: str) -> str:
    """What ``code`` prints, run in a new interpreter (which must exit 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_map_left_early_leaves_no_worker_behind():
    # in a fresh interpreter: the test process itself may have children of other tests
    code = ("import os, time\n"
            "from ccoverlap.workers.pool import LocalEngine\n"
            "def slow(x):\n"
            "    time.sleep(0.01)\n"
            "    return x\n"
            "it = LocalEngine(3).map(slow, range(40))\n"
            "assert next(it) == 0\n"
            "it.close()\n"                                  # the workers are stopped and reaped
            "try:\n"
            "    os.waitpid(-1, os.WNOHANG)\n"
            "except ChildProcessError:\n"
            "    print('no child left')\n")
    assert _in_fresh_python(code) == "no child left"


def test_local_engine_starts_its_workers_without_multiprocessing():
    code = ("import sys\n"
            "from ccoverlap.workers.pool import LocalEngine\n"
            "assert list(LocalEngine(3).map(abs, range(-9, 9))) == [abs(x) for x in range(-9, 9)]\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'multiprocessing'))\n")
    assert _in_fresh_python(code) == "[]"


def test_local_engine_uses_the_cores_it_is_given(monkeypatch):
    from ccoverlap.workers import pool as eng

    big = eng.PARALLEL_MIN_BYTES
    monkeypatch.setattr(eng.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    e = eng.local_engine(8, big)
    assert isinstance(e, LocalEngine) and e.jobs == 2          # one process per core, this one included
    assert isinstance(eng.local_engine(1, big), SerialEngine)   # one rank: in this process
    assert isinstance(eng.local_engine(8, big - 1), SerialEngine)   # too little data to pay for a worker
    monkeypatch.setattr(eng.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert isinstance(eng.local_engine(8, big), SerialEngine)   # one core


_AS_PROGRAM = """
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write("teardown ran\\n"))
sys.argv = ["ccoverlap"] + sys.argv[1:]
runpy.run_module("ccoverlap", run_name="__main__")
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_analyze_as_a_program_skips_the_teardown_and_loses_no_output(jobs, capsys):
    job = FIXTURES / "synthetic" / "two_steps"
    assert main(["analyze", str(job), "--json", "--jobs", jobs]) == 0      # from Python: returns
    expected = capsys.readouterr().out
    run = subprocess.run([sys.executable, "-c", _AS_PROGRAM, "analyze", str(job), "--json", "--jobs", jobs],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout == expected                   # every byte flushed before the process ends
    assert "teardown ran" not in run.stderr         # os._exit: the interpreter's teardown is skipped
    failed = subprocess.run([sys.executable, "-c", _AS_PROGRAM, "analyze", str(job / "missing.json")],
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode == 2 and "teardown ran" in failed.stderr     # an error ends the usual way


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_what_workers_print_is_written_once_in_whole_lines_and_the_parents_pending_output_not_again(unbuffered):
    """Whether or not Python's streams are unbuffered (``PYTHONUNBUFFERED``, where ``print``
    writes its text and its newline separately), every line the worker processes and this one
    print arrives whole, once; the parent's pending text is written once, before them."""
    code = ("import sys\n"
            "from ccoverlap.workers.pool import LocalEngine\n"
            "def say(x):\n"
            "    print(f'item {x}')\n"
            "    return x\n"
            "sys.stdout.write('before ')\n"               # pending in this process's buffer at the fork
            "assert list(LocalEngine(3).map(say, range(6))) == list(range(6))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    for _ in range(20 if unbuffered else 3):  # an interleaving is a matter of timing: several chances
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("before ") and out.stdout.count("before") == 1
        lines = out.stdout[len("before "):].splitlines()
        assert sorted(lines) == [f"item {i}" for i in range(6)], out.stdout


def test_a_fork_that_fails_is_raised_and_leaves_no_pipe_open(monkeypatch):
    from ccoverlap.workers import pool

    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    before = set(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    monkeypatch.setattr(pool.os, "fork", no_fork)
    with pytest.raises(OSError, match="temporarily unavailable"):
        list(LocalEngine(2).map(abs, range(4)))
    if before is not None:
        assert set(os.listdir("/proc/self/fd")) <= before
