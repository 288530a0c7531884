"""A hostile-input campaign against every input surface of ccoverlap (CLI and Python API).

Each case runs in its own subprocess under a memory cap and a time limit and is judged:

- exit 0 with plausible output (no NaN/inf in the output, what-ifs that remove work no longer
  than the measured step, the recommended plan row the fastest it may recommend), or
- exit 2 with one short line on stderr naming the problem (no traceback, no line over 500
  characters, no echo of a huge value), and the user's files as they were;
- an API call returns a result or raises ccoverlap.errors.CCOverlapError (never TypeError,
  ValueError, KeyError, OverflowError, ...) with a one-line message.

Usage::

    python benchmarks/hostile_sweep.py [--jobs 2] [--only SURFACE] [--filter TEXT] [--json FILE]

Prints one line per defect and a table of cases per surface. Exit status 1 when a defect is
found.
"""

from __future__ import annotations

import argparse
import bz2
import copy
import gzip
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
MEM_CAP = 3 << 30  # bytes of address space per case
TIME_LIMIT = 90.0  # seconds per case
HUGE = "9" * 5000
LONG_MSG = 500
REMOVAL_WHATIFS = ("no-comm", "comm-hidden", "no-contention", "centauri", "lagom")


@dataclass
class Case:
    """One hostile input: a CLI argv (after ``ccoverlap``) or an API snippet, and how to judge it."""

    surface: str
    name: str
    argv: list[str] | None = None
    api: str | None = None
    setup: Callable[[Path], None] | None = None
    expect: int | None = None  # 0 or 2 when only one is right
    preserve: list[str] = field(default_factory=list)  # files (relative to the case dir) kept on failure
    check: Callable[[Path, str], str | None] | None = None  # extra judge of a success's stdout
    stdin: str | None = None


# ---------------------------------------------------------------------------------------------
# fixtures: a small valid 2-rank trace, a config, a runs file, a calibration file

def rank_trace(rank: int, world: int = 2, steps: int = 3) -> dict:
    """A valid torch.profiler-like trace of one rank: per step a GEMM and an all-reduce partly
    overlapping, each launched from the host thread (times in microseconds)."""
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "thread 100 (python)"}},
    ]
    corr = 1000
    for s in range(steps):
        t0 = 1_000_000 + s * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "pid": 100,
                   "tid": 100, "ts": t0, "dur": 900, "args": {"External id": s + 1}})
        for k in range(3):
            corr += 1
            kt = t0 + 20 + k * 280
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
                       "ts": kt - 10, "dur": 5, "args": {"External id": corr, "correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": kt,
                       "dur": 200, "args": {"External id": corr, "device": 0, "stream": 7,
                                            "correlation": corr}})
            corr += 1
            ct = kt + 100
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
                       "ts": ct - 8, "dur": 5, "args": {"External id": corr, "correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel",
                       "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                       "pid": 0, "tid": 20, "ts": ct, "dur": 150 + 10 * rank,
                       "args": {"External id": corr, "device": 0, "stream": 20, "correlation": corr,
                                "Collective name": "allreduce", "In msg nelems": 1048576,
                                "Out msg nelems": 1048576, "Group size": world, "dtype": "BFloat16",
                                "Process Group Name": "0", "Process Group Description": "default_pg",
                                "Process Group Ranks": list(range(world))}})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev, "traceName": f"rank{rank}", "displayTimeUnit": "ms"}


def write_json(path: Path, obj, gz: bool = False) -> None:
    text = json.dumps(obj)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def good_traces(d: Path, world: int = 2, sub: str = "t") -> Path:
    t = d / sub
    for r in range(world):
        write_json(t / f"rank-{r}.json", rank_trace(r, world))
    return t


def mutated(mut: Callable[[dict], None], rank0_only: bool = True) -> Callable[[Path], None]:
    """Setup: a 2-rank trace dir ``t`` whose rank 0 (or both ranks) ``mut`` changed."""

    def setup(d: Path) -> None:
        t = good_traces(d)
        for r in ([0] if rank0_only else [0, 1]):
            obj = rank_trace(r)
            mut(obj)
            write_json(t / f"rank-{r}.json", obj)

    return setup


def raw_rank0(data: bytes, name: str = "rank-0.json", keep_rank1: bool = True) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        t = d / "t"
        t.mkdir()
        (t / name).write_bytes(data)
        if keep_rank1:
            write_json(t / "rank-1.json", rank_trace(1))

    return setup


def kernels(obj: dict) -> list[dict]:
    return [e for e in obj["traceEvents"] if e.get("cat") == "kernel"]


def comms(obj: dict) -> list[dict]:
    return [e for e in kernels(obj) if "nccl" in e["name"]]


CONFIG = yaml.safe_load((ROOT / "examples" / "llama3-8b-fsdp-a40.yaml").read_text())
PUBLISHED = yaml.safe_load((ROOT / "ccoverlap" / "data" / "runs" / "published.yaml").read_text())
CALIB = json.loads((ROOT / "calibrations" / "h200.json").read_text())


def config_file(mut: Callable[[dict], None] | None = None, fmt: str = "yaml", name: str = "c") -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        c = copy.deepcopy(CONFIG)
        if mut:
            mut(c)
        p = d / f"{name}.{fmt}"
        if fmt == "yaml":
            p.write_text(yaml.safe_dump(c))
        elif fmt == "json":
            p.write_text(json.dumps(c))
        else:
            p.write_text(to_toml(c))

    return setup


def to_toml(c: dict) -> str:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)

    top = [f"{k} = {val(v)}" for k, v in c.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {val(vv)}" for kk, vv in v.items())
              for k, v in c.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"


def runs_file(mut: Callable[[dict], None] | None = None, name: str = "runs.yaml") -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        r = copy.deepcopy(PUBLISHED)
        r["runs"] = r["runs"][:2]
        if mut:
            mut(r)
        (d / name).write_text(yaml.safe_dump(r, sort_keys=False))

    return setup


def calib_file(mut: Callable[[dict], None] | None = None, name: str = "cal.json") -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        c = copy.deepcopy(CALIB)
        if mut:
            mut(c)
        (d / name).write_text(json.dumps(c))

    return setup


def raw(name: str, data: bytes | str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())

    return setup


def both(*setups: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for s in setups:
            s(d)

    return setup


def sentinel(name: str) -> Callable[[Path], None]:
    """A user's file that a failing command must leave as it was."""

    def setup(d: Path) -> None:
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("USER DATA - keep\n")

    return setup


def setitem(path: str, value) -> Callable[[dict], None]:
    """Mutation: set a dotted key path (``parallel.tp``) to ``value`` (``DEL`` deletes it)."""

    def mut(obj: dict) -> None:
        keys = path.split(".")
        cur = obj
        for k in keys[:-1]:
            cur = cur.setdefault(k, {}) if isinstance(cur, dict) else cur[int(k)]
        if value is DEL:
            cur.pop(keys[-1], None)
        else:
            cur[keys[-1]] = value

    return mut


DEL = object()


# ---------------------------------------------------------------------------------------------
# judges of a success

def _json_out(out: str):
    bad = []
    obj = json.loads(out, parse_constant=lambda c: bad.append(c) or 0.0)
    return obj, bad


def check_replay(d: Path, out: str) -> str | None:
    obj, bad = _json_out(out)
    if bad:
        return f"non-finite numbers in replay --json: {bad[:3]}"
    text = json.dumps(obj)
    measured = obj.get("measured_step_time_s") or obj.get("measured", {}).get("step_time_s") \
        if isinstance(obj, dict) else None
    if measured is None:
        m = re.search(r'"measured[a-z_]*step_time_s": ([0-9.e+-]+)', text)
        measured = float(m.group(1)) if m else None
    if measured is None:
        return None
    for w in obj.get("whatifs", []) if isinstance(obj.get("whatifs"), list) else []:
        if w.get("name") in REMOVAL_WHATIFS and isinstance(w.get("step_time_s"), (int, float)) \
                and w["step_time_s"] > measured * (1 + 1e-9):
            return f"what-if {w['name']} {w['step_time_s']} > measured {measured}"
    return None


def check_plan(d: Path, out: str) -> str | None:
    obj, bad = _json_out(out)
    if bad:
        return f"non-finite numbers in plan --json: {bad[:3]}"
    best = obj.get("best_step_time_s")
    if not isinstance(best, (int, float)) or not best > 0:
        return f"best_step_time_s is {best!r}"
    return None


def check_json(d: Path, out: str) -> str | None:
    _, bad = _json_out(out)
    return f"non-finite numbers in --json output: {bad[:3]}" if bad else None


NONFINITE = re.compile(r"(?<![\w.])(nan|inf|-inf|infinity)(?![\w])", re.I)


def judge(case: Case, d: Path, rc: int, out: str, err: str, before: dict[str, bytes | None]) -> list[str]:
    """The defects of one CLI case's outcome (empty: it behaved)."""
    probs = []
    if "Traceback" in err or "Traceback" in out:
        probs.append("traceback: " + err.strip().splitlines()[-1][:200] if err.strip() else "traceback")
    if rc not in (0, 2):
        probs.append(f"exit {rc}")
    if case.expect is not None and rc != case.expect and rc in (0, 2):
        probs.append(f"exit {rc}, expected {case.expect}")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if lines and lines[0].startswith("usage:"):  # argparse's usage block, then its one error line
        lines = [ln for ln in lines if not ln.startswith(("usage:", " "))]
    if any(len(ln) > LONG_MSG for ln in lines):
        probs.append(f"stderr line of {max(len(ln) for ln in lines)} chars")
    if "9" * 200 in err or "9" * 200 in out and rc != 0:
        probs.append("echoes a huge value")
    if rc == 2:
        if not lines:
            probs.append("exit 2 with nothing on stderr")
        elif len(lines) > 1 and not all(ln.lower().startswith(("warning", "note", "ccoverlap: warning"))
                                        for ln in lines[:-1]):
            probs.append(f"{len(lines)} stderr lines: {' | '.join(ln[:80] for ln in lines[:4])}")
        for rel, data in before.items():
            now = (d / rel).read_bytes() if (d / rel).is_file() else None
            if now != data:
                probs.append(f"user file {rel} changed on failure")
    if rc == 0:
        if not out.strip() and "-q" not in (case.argv or []):
            probs.append("exit 0 with no output")
        m = NONFINITE.search(out)
        if m and "--json" not in (case.argv or []):
            probs.append(f"non-finite value in output: ...{out[max(0, m.start() - 60):m.end() + 20]!r}")
        if case.check:
            try:
                p = case.check(d, out)
            except Exception as e:  # noqa: BLE001 - a judge's failure is reported, not fatal
                p = f"judge failed: {type(e).__name__}: {e}"
            if p:
                probs.append(p)
        elif "--json" in (case.argv or []):
            try:
                p = check_json(d, out)
            except ValueError as e:
                p = f"--json output is not JSON: {e}"
            if p:
                probs.append(p)
    return probs


API_PRELUDE = """
import json, math, sys, traceback
import numpy as np
import ccoverlap as cc
from ccoverlap.errors import CCOverlapError
def _fin(o):
    if isinstance(o, float):
        return math.isfinite(o)
    if isinstance(o, dict):
        return all(_fin(v) for v in o.values())
    if isinstance(o, (list, tuple)):
        return all(_fin(v) for v in o)
    return True
try:
    r = eval(compile(sys.argv[1], "case", "eval"))
    d = r.to_dict() if hasattr(r, "to_dict") and type(r).__module__.startswith("ccoverlap") else None
    out = {"ok": True, "finite": _fin(d), "repr": repr(r)[:200]}
except CCOverlapError as e:
    out = {"ok": False, "cc": True, "type": type(e).__name__, "msg": str(e)}
except BaseException as e:
    out = {"ok": False, "cc": False, "type": type(e).__name__, "msg": str(e)[:300],
           "where": traceback.format_exc().strip().splitlines()[-3][:200]}
print("@@RESULT@@" + json.dumps(out))
"""


def judge_api(rc: int, out: str, err: str) -> list[str]:
    m = re.search(r"@@RESULT@@(.*)", out)
    if not m:
        return [f"no result (exit {rc}): {err.strip().splitlines()[-1][:200] if err.strip() else ''}"]
    res = json.loads(m.group(1))
    if res["ok"]:
        return [] if res["finite"] else ["result holds NaN/inf"]
    if not res["cc"]:
        return [f"raises {res['type']}: {res['msg'][:160]} ({res.get('where', '')})"]
    msg = res["msg"]
    probs = []
    if "\n" in msg.strip():
        probs.append("multi-line error message")
    if len(msg) > LONG_MSG:
        probs.append(f"error message of {len(msg)} chars")
    if "9" * 200 in msg:
        probs.append("echoes a huge value")
    return probs


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_CAP, MEM_CAP))
    os.setsid()


def run_case(case: Case, base: Path) -> tuple[Case, list[str], float, int]:
    d = base / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{case.surface}-{case.name}")[:120]
    d.mkdir(parents=True, exist_ok=True)
    if case.setup:
        case.setup(d)
    before = {rel: ((d / rel).read_bytes() if (d / rel).is_file() else None) for rel in case.preserve}
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100", NO_COLOR="1")
    cmd = [PY, "-m", "ccoverlap", *case.argv] if case.argv is not None else [PY, "-c", API_PRELUDE, case.api or ""]
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=d, env=env, capture_output=True, timeout=TIME_LIMIT, preexec_fn=_limits,
                           input=(case.stdin or "").encode(), check=False)
    except subprocess.TimeoutExpired as e:
        if e.args and isinstance(e.args[0], list):
            pass
        return case, [f"hang: no answer in {TIME_LIMIT:.0f} s"], time.monotonic() - t, -1
    dt = time.monotonic() - t
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    (d / "_stdout").write_text(out)
    (d / "_stderr").write_text(err)
    if case.api is not None:
        return case, judge_api(p.returncode, out, err), dt, p.returncode
    return case, judge(case, d, p.returncode, out, err, before), dt, p.returncode


# ---------------------------------------------------------------------------------------------
# the cases

def trace_cases() -> list[Case]:
    cs: list[Case] = []
    S = "trace"

    def an(name, setup, *flags, target="t", expect=None, cmd="analyze", check=None, preserve=()):
        cs.append(Case(S, f"{cmd}:{name}", [cmd, target, "-q", *flags], setup=setup, expect=expect,
                       check=check, preserve=list(preserve)))

    # valid baselines
    an("good", good_traces, expect=0)
    an("good-json", good_traces, "--json", expect=0)
    an("good", good_traces, cmd="replay", expect=0)
    an("good-json", good_traces, "--json", cmd="replay", expect=0, check=check_replay)
    an("good-gz", lambda d: [write_json(d / "t" / f"rank-{r}.json.gz", rank_trace(r), gz=True) for r in (0, 1)],
       expect=0)
    # whole-file damage (rank 0 only; rank 1 stays good)
    for nm, data in [("empty", b""), ("spaces", b"   \n\t "), ("null", b"null"), ("list", b"[]"), ("obj", b"{}"),
                     ("number", b"123"), ("string", b'"x"'), ("truncated", json.dumps(rank_trace(0)).encode()[:500]),
                     ("trailing-garbage", json.dumps(rank_trace(0)).encode() + b"}}garbage"),
                     ("bom8", b"\xef\xbb\xbf" + json.dumps(rank_trace(0)).encode()),
                     ("utf16", json.dumps(rank_trace(0)).encode("utf-16")),
                     ("invalid-utf8", json.dumps(rank_trace(0)).encode().replace(b"gemm", b"ge\xff\xfem")),
                     ("nul-bytes", b"\x00" * 1000), ("binary", bytes(range(256)) * 10),
                     ("nan-literals", json.dumps(rank_trace(0)).replace('"dur": 200', '"dur": NaN').encode()),
                     ("inf-literals", json.dumps(rank_trace(0)).replace('"dur": 200', '"dur": Infinity').encode()),
                     ("neg-inf-ts", json.dumps(rank_trace(0)).replace('"ts": 1000020', '"ts": -Infinity').encode()),
                     ("1e400", json.dumps(rank_trace(0)).replace('"dur": 200', '"dur": 1e400').encode()),
                     ("huge-int", json.dumps(rank_trace(0)).replace('"dur": 200', f'"dur": {HUGE}').encode()),
                     ("dup-keys", json.dumps(rank_trace(0)).replace('"ts": 1000020,', '"ts": 1000020, "ts": "x",')
                      .encode()),
                     ("deep-nest", json.dumps(rank_trace(0)).replace('"args": {"External id": 1}',
                                                                      '"args": ' + "[" * 5000 + "]" * 5000).encode()),
                     ("deep-unclosed", b'{"traceEvents": ' + b"[" * 200000),
                     ("long-string", json.dumps(rank_trace(0)).replace('"python"', '"' + "a" * (40 << 20) + '"')
                      .encode())]:
        an(nm, raw_rank0(data))
    # gzip edge cases
    good0 = json.dumps(rank_trace(0)).encode()
    for nm, fname, data in [("gz-truncated", "rank-0.json.gz", gzip.compress(good0)[:300]),
                            ("gz-empty", "rank-0.json.gz", gzip.compress(b"")),
                            ("gz-garbage-after", "rank-0.json.gz", gzip.compress(good0) + b"garbage"),
                            ("gz-double", "rank-0.json.gz", gzip.compress(gzip.compress(good0))),
                            ("gz-ext-plain", "rank-0.json.gz", good0),
                            ("plain-ext-gz", "rank-0.json", gzip.compress(good0)),
                            ("bz2", "rank-0.json.gz", bz2.compress(good0)),
                            ("gz-zero-bytes", "rank-0.json.gz", b""),
                            ("gz-bomb", "rank-0.json.gz",
                             gzip.compress(b'{"traceEvents": [' + b" " * (400 << 20) + b"]}", 9))]:
        an(nm, raw_rank0(data, fname))
    # traceEvents wrong types
    for nm, v in [("te-dict", {}), ("te-str", "x"), ("te-num", 5), ("te-null", None),
                  ("te-items-num", [1, 2, 3]), ("te-items-null", [None]), ("te-items-list", [[1], [2]]),
                  ("te-items-str", ["a"])]:
        an(nm, mutated(setitem("traceEvents", v)))
    an("te-missing", mutated(setitem("traceEvents", DEL)))

    # wrong types / values for each event field (set on every kernel of rank 0)
    def on_kernels(fld: str, v, which=kernels):
        def mut(o):
            for e in which(o):
                if v is DEL:
                    e.pop(fld, None)
                else:
                    e[fld] = v
        return mut

    def on_args(fld: str, v, which=comms):
        def mut(o):
            for e in which(o):
                if v is DEL:
                    e["args"].pop(fld, None)
                else:
                    e["args"][fld] = v
        return mut

    vals = {"str": "12", "null": None, "list": [1], "dict": {"a": 1}, "neg": -1, "float": 1.5, "huge": 2 ** 70,
            "bool": True, "zero": 0, "1e300": 1e300, "del": DEL}
    for fld in ("ts", "dur"):
        for vn, v in vals.items():
            an(f"kernel-{fld}-{vn}", mutated(on_kernels(fld, v)))
    for fld, vs in [("ph", ("num", 3)), ("cat", ("list", ["kernel"])), ("name", ("dict", {"a": 1})),
                    ("pid", ("str", "x")), ("tid", ("list", [1])), ("args", ("list", [1])),
                    ("args", ("str", "x")), ("args", ("null", None)), ("name", ("huge", "k" * 100000)),
                    ("pid", ("huge", 2 ** 80)), ("tid", ("neg", -7))]:
        an(f"kernel-{fld}-{vs[0]}", mutated(on_kernels(fld, vs[1])))
    for fld, vn, v in [("External id", "str", "x"), ("External id", "huge", 2 ** 70), ("correlation", "neg", -5),
                       ("correlation", "str", "a"), ("stream", "str", "s"), ("stream", "huge", 2 ** 64),
                       ("device", "neg", -1), ("device", "huge", 10 ** 30), ("device", "str", "cuda:0"),
                       ("Collective name", "num", 3), ("Collective name", "unknown", "frobnicate"),
                       ("Collective name", "empty", ""), ("In msg nelems", "neg", -1),
                       ("In msg nelems", "str", "many"), ("In msg nelems", "huge", 10 ** 40),
                       ("In msg nelems", "float", 1.5), ("Out msg nelems", "null", None),
                       ("Group size", "zero", 0), ("Group size", "neg", -3), ("Group size", "str", "2"),
                       ("Group size", "2**64", 2 ** 64), ("Group size", "huge-vs-world", 100000),
                       ("dtype", "unknown", "Float128"), ("dtype", "num", 7), ("Process Group Name", "num", 5),
                       ("Process Group Name", "list", ["a"]), ("Process Group Ranks", "str", "0,1"),
                       ("Process Group Ranks", "strs", ["a", "b"]), ("Process Group Ranks", "huge", list(range(50000))),
                       ("Process Group Ranks", "neg", [-1, -2]), ("Process Group Description", "dict", {"x": 1})]:
        an(f"comm-{fld.replace(' ', '_')}-{vn}", mutated(on_args(fld, v)))
    # one bad timestamp among good ones
    def one_kernel(fld, v):
        def mut(o):
            kernels(o)[2][fld] = v
        return mut
    for vn, v in [("neg1", -1), ("huge", 10 ** 18), ("before-launch", 1000000), ("zero", 0)]:
        an(f"one-kernel-ts-{vn}", mutated(one_kernel("ts", v)), "--json", cmd="replay", check=check_replay)
        an(f"one-kernel-ts-{vn}", mutated(one_kernel("ts", v)), "--json")
    an("one-kernel-dur-huge", mutated(one_kernel("dur", 10 ** 15)), "--json", cmd="replay", check=check_replay)

    # distributedInfo and headers
    for nm, v in [("rank-super2", "²"), ("rank-huge-str", HUGE), ("rank-2**64", 2 ** 64), ("rank-neg", -1),
                  ("rank-float", 1.5), ("rank-bool", True), ("rank-null", None), ("rank-list", [0]),
                  ("rank-nan-str", "nan")]:
        an(f"dist-{nm}", mutated(setitem("distributedInfo.rank", v)))
    for nm, v in [("ws-zero", 0), ("ws-neg", -2), ("ws-str", "two"), ("ws-huge", 2 ** 64), ("ws-1", 1),
                  ("ws-float", 2.5)]:
        an(f"dist-{nm}", mutated(setitem("distributedInfo.world_size", v)))
    for nm, v in [("dist-str", "x"), ("dist-list", [1]), ("dist-missing", DEL), ("devprops-str", "x")]:
        key = "distributedInfo" if nm.startswith("dist") else "deviceProperties"
        an(nm, mutated(setitem(key, v)))
    an("dist-rank-ge-world", mutated(setitem("distributedInfo.rank", 5)))
    an("schema-str", mutated(setitem("schemaVersion", "x")))
    an("basetime-str", mutated(setitem("baseTimeNanoseconds", "soon")))
    an("basetime-huge", mutated(setitem("baseTimeNanoseconds", 10 ** 30)))

    def dup_rank(d: Path) -> None:
        t = good_traces(d)
        write_json(t / "rank-1.json", rank_trace(0))

    an("dup-rank", dup_rank)
    an("dup-rank", dup_rank, cmd="replay")

    def ranks_of(pairs: tuple[tuple[int, int], ...]) -> Callable[[Path], None]:
        """A job of one trace per ``(rank, world size)`` pair."""
        def setup(d: Path) -> None:
            for rank, world in pairs:
                write_json(d / "t" / f"rank-{rank}.json", rank_trace(rank, world))
        return setup

    for nm, pairs in (("missing-rank", ((0, 3), (2, 3))), ("mismatched-world", ((0, 2), (1, 4)))):
        an(nm, ranks_of(pairs))
        an(nm, ranks_of(pairs), cmd="replay")
    an("rank-30-digit-name", raw_rank0(json.dumps(rank_trace(0)).encode(), "rank-" + "1" * 30 + ".json"))
    an("unicode-name", raw_rank0(json.dumps(rank_trace(0)).encode(), "rank-0-é漢字.json"))
    an("newline-name", raw_rank0(json.dumps(rank_trace(0)).encode(), "rank-0\nx.json"))
    # steps
    for nm, v in [("step-abc", "ProfilerStep#abc"), ("step-neg", "ProfilerStep#-1"),
                  ("step-huge", "ProfilerStep#" + "9" * 30), ("step-empty", "ProfilerStep#")]:
        def mut(o, v=v):
            for e in o["traceEvents"]:
                if str(e.get("name", "")).startswith("ProfilerStep"):
                    e["name"] = v
        an(nm, mutated(mut, rank0_only=False))

    def no_steps(o):
        o["traceEvents"] = [e for e in o["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")]
    an("no-steps", mutated(no_steps, rank0_only=False))
    an("no-steps", mutated(no_steps, rank0_only=False), cmd="replay")

    def overlap_steps(o):
        for e in o["traceEvents"]:
            if str(e.get("name", "")).startswith("ProfilerStep"):
                e["dur"] = 5000
    an("overlapping-steps", mutated(overlap_steps, rank0_only=False), "--json")
    an("overlapping-steps", mutated(overlap_steps, rank0_only=False), "--json", cmd="replay", check=check_replay)

    def step_dur(v):
        def mut(o):
            for e in o["traceEvents"]:
                if str(e.get("name", "")).startswith("ProfilerStep"):
                    e["dur"] = v
        return mut
    an("step-dur-0", mutated(step_dur(0), rank0_only=False))
    an("step-dur-neg", mutated(step_dur(-900), rank0_only=False))
    an("no-kernels", mutated(lambda o: o.update(traceEvents=[e for e in o["traceEvents"]
                                                               if e.get("cat") != "kernel"]), rank0_only=False))
    an("no-kernels", mutated(lambda o: o.update(traceEvents=[e for e in o["traceEvents"]
                                                               if e.get("cat") != "kernel"]), rank0_only=False),
       cmd="replay")
    an("only-comm", mutated(lambda o: o.update(traceEvents=[e for e in o["traceEvents"]
                                                              if "gemm" not in str(e.get("name"))]),
                            rank0_only=False), "--json", cmd="replay", check=check_replay)
    # directories and special files
    an("empty-dir", lambda d: (d / "t").mkdir())
    an("nonexistent", None)
    an("junk-dir", both(raw("t/notes.txt", "hello"), raw("t/img.png", b"\x89PNG\r\n" + b"\0" * 100),
                        raw("t/sub/x.json", "{}"), raw("t/.hidden.json", "{")))
    an("mixed-junk", both(good_traces, raw("t/notes.txt", "hello"), raw("t/bad.json", "{"),
                          raw("t/rank-9.json.gz", b"\x1f\x8b junk")))

    def symlink_loop(d: Path) -> None:
        t = good_traces(d)
        os.symlink("loop", t / "loop")
        os.symlink(str(t), t / "self")
    an("symlink-loop", symlink_loop)

    def dangling(d: Path) -> None:
        t = good_traces(d)
        os.symlink("nowhere.json", t / "rank-5.json")
    an("dangling-symlink", dangling)

    def devzero(d: Path) -> None:
        t = good_traces(d)
        os.symlink("/dev/zero", t / "rank-5.json")
    an("dev-zero", devzero)

    def devzero_gz(d: Path) -> None:
        t = good_traces(d)
        os.symlink("/dev/zero", t / "rank-5.json.gz")
    an("dev-zero-gz", devzero_gz)

    def fifo(d: Path) -> None:
        t = good_traces(d)
        os.mkfifo(t / "rank-5.json")
    an("fifo", fifo)
    an("fifo-file", lambda d: os.mkfifo(d / "f.json"), target="f.json")
    an("file-is-dir", lambda d: (d / "t" / "rank-0.json").mkdir(parents=True))
    an("long-path", None, target="x" * 5000)
    an("long-path-component", None, target="/".join(["y" * 250] * 30))
    an("devnull", None, target="/dev/null")
    an("many-bad-files", lambda d: [raw(f"t/r{i}.json", "{")(d) for i in range(3000)])

    def hundred_ranks(d: Path) -> None:
        for r in range(100):
            write_json(d / "t" / f"rank-{r}.json", rank_trace(r, 100, steps=2))
    an("100-ranks", hundred_ranks, "--json")
    # flags
    for v in ["", "abc", "3-1", "0", "-5", "1-99999999999999999999999", "1,,2", "all", HUGE, "2-", "-", "1-2-3",
              "nan", "٣"]:
        an(f"steps={v[:20]}", good_traces, "--steps", v)
    an("steps-beyond", good_traces, "--steps", "50-60")
    for v in ["bogus", ""]:
        an(f"time-res={v}", good_traces, "--time-resolution", v)
    for v in ["0", "-1", "abc", "99999", HUGE, "1.5"]:
        an(f"jobs={v[:10]}", good_traces, "--jobs", v)
    for v in ["999", "0", "-1", "abc", HUGE]:
        an(f"png-step={v[:10]}", good_traces, "--png-step", v, "--png", "p.png")
    for nm, content in [("missing", None), ("invalid", "{"), ("list", "[1]"), ("unknown-key", '{"nope": "dp"}'),
                        ("bad-value", '{"0": "bogus-dim"}'), ("num-value", '{"0": 5}'), ("empty", "{}"),
                        ("good", '{"0": "dp"}')]:
        setup = good_traces if content is None else both(good_traces, raw("g.json", content))
        an(f"groups-{nm}", setup, "--groups", "g.json")
    an("out-is-file", both(good_traces, sentinel("o")), "--out", "o", "--png", preserve=["o"])
    an("out-through-file", both(good_traces, sentinel("o")), "--out", "o/sub", "--png", preserve=["o"])
    an("png-unwritable", good_traces, "--png", "/proc/nope/x.png")
    an("png-is-dir", both(good_traces, lambda d: (d / "pd").mkdir()), "--png", "pd")
    an("png-existing", both(good_traces, sentinel("p.png")), "--png", "p.png", "--png-step", "77",
       preserve=["p.png"])
    an("out-long", good_traces, "--out", "z" * 5000, "--png")
    an("vs-nonexistent", good_traces, "--vs", "nope")
    an("vs-junk", both(good_traces, raw("j/x.json", "{")), "--vs", "j")
    an("vs-same", good_traces, "--vs", "t", expect=0)
    an("vs-mismatched", both(good_traces, lambda d: good_traces(d, 4, "u")), "--vs", "u")
    an("engine-bad", good_traces, "--engine", "bogus")
    an("address-no-ray", good_traces, "--address", "localhost:1")
    for v in ["bogus", "", ",,", "no-comm,bogus", "x" * 5000, "no-comm,no-comm"]:
        an(f"whatif={v[:12]}", good_traces, "--whatif", v, cmd="replay")
    an("whatif-all-json", good_traces, "--json", "--whatif",
       "no-comm,comm-hidden,no-contention,centauri,lagom", cmd="replay", check=check_replay)
    for v in ["bogus", "", HUGE]:
        an(f"cluster={v[:10]}", good_traces, "--cluster", v, cmd="replay")
    an("replay-out-is-file", both(good_traces, sentinel("o")), "--out", "o", "--png", cmd="replay",
       preserve=["o"])
    an("replay-steps-huge", good_traces, "--steps", "1-99999999999999999999999", cmd="replay")
    return cs


def config_cases() -> list[Case]:
    cs: list[Case] = []
    S = "config"
    cmds = {"plan": ["plan", "-q", "--json"], "simulate": ["simulate", "-q", "--json"], "tune": ["tune", "-q"]}

    def cfg(name, setup, cmd="simulate", fname="c.yaml", extra=(), expect=None, check=None, preserve=()):
        if check is None and cmd == "plan":
            check = check_plan
        cs.append(Case(S, f"{cmd}:{name}", [*cmds[cmd], "--config", fname, *extra], setup=setup, expect=expect,
                       check=check, preserve=list(preserve)))

    cfg("good", config_file(), expect=0)
    cfg("good", config_file(), cmd="plan", expect=0)
    cfg("good-json", config_file(fmt="json"), fname="c.json", expect=0)
    cfg("good-toml", config_file(fmt="toml"), fname="c.toml", expect=0)
    for nm, data, fn in [("empty", "", "c.yaml"), ("empty-json", "", "c.json"), ("empty-toml", "", "c.toml"),
                         ("list", "- 1\n- 2\n", "c.yaml"), ("scalar", "42\n", "c.yaml"), ("null", "null", "c.json"),
                         ("invalid-yaml", "model: [\n", "c.yaml"), ("invalid-json", "{", "c.json"),
                         ("invalid-toml", "model = \n", "c.toml"), ("tab-yaml", "model:\tllama-3-8b\n\t- x", "c.yaml"),
                         ("python-tag", "model: !!python/object/apply:os.system ['echo pwned']\n", "c.yaml"),
                         ("billion-laughs", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                          "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                          "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
                          "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
                          "model: *h\n", "c.yaml"),
                         ("json-nan", '{"model": "llama-3-8b", "cluster": "a40-pcie", "nodes": NaN}', "c.json"),
                         ("bom-yaml", "\ufeff" + yaml.safe_dump(CONFIG), "c.yaml"),
                         ("bom-json", "\ufeff" + json.dumps(CONFIG), "c.json"),
                         ("dup-keys", "model: llama-3-8b\nmodel: gpt-3-175b\ncluster: a40-pcie\n", "c.yaml"),
                         ("binary", "\x00\x01\x02", "c.yaml"),
                         ("unknown-ext", yaml.safe_dump(CONFIG), "c.txt"),
                         ("no-ext", yaml.safe_dump(CONFIG), "c"),
                         ("yaml-as-json", yaml.safe_dump(CONFIG), "c.json"),
                         ("deep-nest", "model: " + "[" * 10000 + "]" * 10000 + "\n", "c.yaml"),
                         ("huge-int", f"model: llama-3-8b\ncluster: a40-pcie\nnodes: {HUGE}\n", "c.yaml"),
                         ("yaml-inf", "model: llama-3-8b\ncluster: a40-pcie\nnodes: .inf\n", "c.yaml"),
                         ("yaml-date", "model: 2024-01-01\ncluster: a40-pcie\n", "c.yaml"),
                         ("toml-datetime", 'model = 1979-05-27T07:32:00Z\ncluster = "a40-pcie"\n', "c.toml")]:
        cfg(nm, raw(fn, data), fname=fn)
    cfg("nonexistent", None, fname="nope.yaml")
    cfg("dir", lambda d: (d / "c.yaml").mkdir())
    cfg("fifo", lambda d: os.mkfifo(d / "c.yaml"))
    cfg("devzero", lambda d: os.symlink("/dev/zero", d / "c.yaml"))
    cfg("long-path", None, fname="c" * 5000 + ".yaml")
    # impossible / wrong values (simulate; a few through plan and tune)
    muts = [("unknown-key", "bogus_key", 1), ("model-unknown", "model", "llama-9-999b"), ("model-num", "model", 7),
            ("model-null", "model", None), ("model-list", "model", ["a"]),
            ("model-dict-partial", "model", {"name": "x", "hidden": 4096}),
            ("model-dict-neg", "model", {"name": "x", "hidden": -4096, "heads": 32, "layers": 2, "vocab": 1000,
                                         "ffn_hidden": 1000}),
            ("cluster-unknown", "cluster", "dgx-z9000"), ("cluster-num", "cluster", 3),
            ("cluster-dict-neg-bw", "cluster", {"name": "x", "nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM",
                                                "intra": {"fabric": "nvswitch", "bandwidth_bytes_per_s": -1,
                                                          "latency_s": 1e-6},
                                                "inter": {"fabric": "ib", "bandwidth_bytes_per_s": 0,
                                                          "latency_s": 1e-6}}),
            ("cluster-dict-nan", "cluster", {"name": "x", "nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM",
                                             "intra": {"fabric": "nvswitch", "bandwidth_bytes_per_s": float("nan"),
                                                       "latency_s": 1e-6},
                                             "inter": {"fabric": "ib", "bandwidth_bytes_per_s": 1e10,
                                                       "latency_s": 1e-6}}),
            ("cluster-gpu-unknown", "cluster", {"name": "x", "nodes": 2, "gpus_per_node": 8, "gpu": "Z100"}),
            ("nodes-zero", "nodes", 0), ("nodes-neg", "nodes", -2), ("nodes-str", "nodes", "two"),
            ("nodes-float", "nodes", 2.5), ("nodes-bool", "nodes", True), ("nodes-huge", "nodes", 10 ** 6),
            ("nodes-2**70", "nodes", 2 ** 70),
            ("tp-3", "parallel.tp", 3), ("tp-zero", "parallel.tp", 0), ("tp-neg", "parallel.tp", -1),
            ("tp-str", "parallel.tp", "two"), ("tp-float", "parallel.tp", 1.5), ("tp-bool", "parallel.tp", True),
            ("tp-huge", "parallel.tp", 2 ** 70), ("tp-null", "parallel.tp", None),
            ("dp-too-many", "parallel.dp", 64), ("dp-huge", "parallel.dp", 10 ** 12),
            ("pp-gt-layers", "parallel.pp", 64), ("ep-dense", "parallel.ep", 4), ("cp-huge", "parallel.cp", 4096),
            ("dparallel-bad", "parallel.data_parallel", "zero9"), ("parallel-list", "parallel", [1, 2]),
            ("pp-schedule-bad", "parallel.pp_schedule", "zigzag"), ("recompute-bad", "parallel.recompute", 5),
            ("virtual-stages-neg", "parallel.virtual_stages", -2),
            ("gb-zero", "batch.global_batch", 0), ("gb-indivisible", "batch.global_batch", 33),
            ("mb-zero", "batch.micro_batch", 0), ("mb-gt-gb", "batch.micro_batch", 64),
            ("seq-zero", "batch.seq_len", 0), ("seq-huge", "batch.seq_len", 10 ** 9),
            ("seq-2**70", "batch.seq_len", 2 ** 70), ("seq-str", "batch.seq_len", "4k"),
            ("batch-str", "batch", "big"), ("knob-unknown", "knobs.bogus", 1),
            ("knob-str", "knobs.fsdp_prefetch", "lots"), ("knob-neg", "knobs.fsdp_prefetch", -3),
            ("knob-huge", "knobs.fsdp_prefetch", 10 ** 9), ("knobs-list", "knobs", [1]),
            ("knob-bucket-zero", "knobs.bucket_cap_mb", 0), ("knob-bucket-nan", "knobs.bucket_cap_mb", float("nan")),
            ("dtype-bad", "dtype", "int3"), ("framework-bad", "framework", "jax-9"),
            ("calibration-missing", "calibration", "nope.json")]
    for nm, key, v in muts:
        fmt = "json" if isinstance(v, float) and not math.isfinite(v) else "yaml"
        cfg(nm, config_file(setitem(key, v), fmt=fmt), fname=f"c.{fmt}")
    for nm, key, v in [("tp-3", "parallel.tp", 3), ("dp-too-many", "parallel.dp", 64), ("nodes-zero", "nodes", 0),
                       ("seq-huge", "batch.seq_len", 10 ** 9), ("knob-str", "knobs.fsdp_prefetch", "lots")]:
        cfg(nm, config_file(setitem(key, v)), cmd="plan")
    for nm, key, v in [("tp-3", "parallel.tp", 3), ("nodes-zero", "nodes", 0)]:
        cfg(nm, config_file(setitem(key, v)), cmd="tune")
    return cs


def flag_cases() -> list[Case]:
    cs: list[Case] = []
    S = "flags"
    base = ["--model", "llama-3-8b", "--cluster", "a40-pcie", "--nodes", "1", "--dp", "8", "--global-batch", "8",
            "--micro-batch", "1"]

    def fl(name, argv, setup=None, expect=None, check=None, preserve=()):
        cs.append(Case(S, name, argv, setup=setup, expect=expect, check=check, preserve=list(preserve)))

    fl("simulate-good", ["simulate", "-q", *base], expect=0)
    for flag in ["--nodes", "--tp", "--pp", "--dp", "--ep", "--cp", "--global-batch", "--micro-batch", "--seq-len",
                 "--virtual-stages"]:
        for v in ["", "abc", "-1", "0", HUGE, "1.5", "1e3", "0x10"]:
            if flag in ("--pp", "--ep", "--cp") and v in ("1e3", "0x10", "1.5"):
                continue
            argv = [a for a in base]
            if flag in argv:
                i = argv.index(flag)
                argv[i + 1] = v
            else:
                argv += [flag, v]
            fl(f"simulate{flag}={v[:8]}", ["simulate", "-q", *argv])
    for v in ["", "bogus", "x=", "=3", "fsdp_prefetch=abc", "fsdp_prefetch=-1", "fsdp_prefetch=" + HUGE,
              "fsdp_prefetch=nan", "bucket_cap_mb=inf", "fsdp_prefetch=1=2"]:
        fl(f"simulate--knob={v[:18]}", ["simulate", "-q", *base, "--knob", v])
    for flag, vals in [("--model", ["", "bogus", HUGE, "llama"]), ("--cluster", ["", "bogus", "h100"]),
                       ("--framework", ["", "bogus"]), ("--dtype", ["int4"]), ("--data-parallel", ["zero"]),
                       ("--pp-schedule", ["x"]), ("--recompute", ["some"])]:
        for v in vals:
            argv = [a for a in base]
            if flag in argv:
                argv[argv.index(flag) + 1] = v
            else:
                argv += [flag, v]
            fl(f"simulate{flag}={v[:8]}", ["simulate", "-q", *argv])
    fl("simulate-no-model", ["simulate", "-q", "--cluster", "a40-pcie"])
    fl("simulate-unknown-flag", ["simulate", "-q", *base, "--bogus-flag"])
    fl("simulate-gzip", ["simulate", "-q", *base, "--gzip", "--out", "o"], expect=0)
    # plan flags
    pb = ["plan", "-q", "--json", *base]
    fl("plan-good", pb, expect=0, check=check_plan)
    for v in ["", "bogus", ",", "lagom,bogus", "x" * 5000]:
        fl(f"plan--strategies={v[:10]}", [*pb, "--strategies", v])
    for v in ["", "bogus", HUGE]:
        fl(f"plan--strategy={v[:10]}", [*pb, "--strategy", v])
    for v in ["", "jax", HUGE]:
        fl(f"plan--target={v[:10]}", [*pb, "--target", v])
    for v in ["0", "-1", "abc", HUGE]:
        fl(f"plan-search--max-sim={v[:10]}", [*pb, "--search", "--max-simulations", v])
        fl(f"plan-search--top={v[:10]}", [*pb, "--search", "--top", v])
        fl(f"plan-search--show={v[:10]}", [*pb, "--search", "--show", v])
    fl("plan-405b-fsdp128", ["plan", "-q", "--json", "--model", "llama-3-405b", "--cluster", "dgx-h100", "--nodes",
                             "16", "--dp", "128", "--data-parallel", "fsdp", "--global-batch", "128",
                             "--micro-batch", "1"], expect=0, check=check_plan)
    fl("plan-engine-bad", [*pb, "--engine", "bogus", "--search"])
    # ficco
    fb = ["ficco", "-q", "--m", "4096", "--n", "4096", "--k", "4096", "--world", "8", "--cluster", "dgx-h100"]
    fl("ficco-good", fb, expect=0)
    fl("ficco-good-json", [*fb, "--json"], expect=0)
    for flag in ["--m", "--n", "--k", "--world"]:
        for v in ["0", "-1", "abc", HUGE, "1.5", "1"]:
            argv = list(fb)
            argv[argv.index(flag) + 1] = v
            fl(f"ficco{flag}={v[:8]}", [*argv, "--json"])
    for flag, v in [("--cluster", "bogus"), ("--topology", "ring"), ("--engine", "tpu"), ("--pattern", "x"),
                    ("--cluster", "a40-pcie")]:
        argv = list(fb) + [flag, v] if flag not in fb else [a if a != "dgx-h100" else v for a in fb]
        fl(f"ficco{flag}={v}", [*argv, "--json"])
    fl("ficco-accuracy", ["ficco", "-q", "--accuracy", "--json"])
    fl("ficco-no-args", ["ficco", "-q"])
    # tune
    tb = ["tune", "-q", "--group", "g.yaml"]
    group = yaml.safe_load((ROOT / "examples" / "overlap-group-tp-a40.yaml").read_text())

    def grp(mut=None):
        def setup(d: Path) -> None:
            g = copy.deepcopy(group)
            if mut:
                mut(g)
            (d / "g.yaml").write_text(yaml.safe_dump(g))
        return setup

    fl("tune-group-good", tb, setup=grp(), expect=0)
    for nm, mut in [("no-comps", setitem("computations", [])), ("no-colls", setitem("collectives", [])),
                    ("comps-str", setitem("computations", "x")),
                    ("bytes-neg", lambda g: g["collectives"][0].update(bytes=-5)),
                    ("bytes-bad-unit", lambda g: g["collectives"][0].update(bytes="16XiB")),
                    ("bytes-huge", lambda g: g["collectives"][0].update(bytes=10 ** 30)),
                    ("bytes-nan", lambda g: g["collectives"][0].update(bytes=".nan")),
                    ("group-size-0", lambda g: g["collectives"][0].update(group_size=0)),
                    ("group-size-huge", lambda g: g["collectives"][0].update(group_size=10 ** 9)),
                    ("coll-unknown", lambda g: g["collectives"][0].update(collective="teleport")),
                    ("gemm-zero", lambda g: g["computations"][0]["gemm"].update(m=0)),
                    ("gemm-neg", lambda g: g["computations"][0]["gemm"].update(k=-4)),
                    ("gemm-str", lambda g: g["computations"][0]["gemm"].update(n="big")),
                    ("gemm-huge", lambda g: g["computations"][0]["gemm"].update(m=10 ** 15)),
                    ("cluster-bad", setitem("cluster", "bogus")), ("nodes-neg", setitem("nodes", -1)),
                    ("unknown-key", setitem("bogus", 1)), ("comp-null", lambda g: g["computations"].append(None))]:
        fl(f"tune-group-{nm}", tb, setup=grp(mut))
    for flag, v in [("--top", "0"), ("--top", "-1"), ("--max-exhaustive", "-1"), ("--max-exhaustive", HUGE),
                    ("--exhaustive", "maybe")]:
        fl(f"tune{flag}={v[:8]}", [*tb, flag, v], setup=grp())
    fl("tune-group-nonexistent", ["tune", "-q", "--group", "nope.yaml"])
    fl("tune-emit-file", [*tb, "--emit", "e"], setup=both(grp(), sentinel("e")), preserve=["e"])
    fl("tune-emit-through-file", [*tb, "--emit", "e/x"], setup=both(grp(), sentinel("e")), preserve=["e"])
    # reproduce
    for flag, v in [("--paper", "bogus"), ("--case", "bogus"), ("--case", HUGE), ("--jobs", "0"),
                    ("--jobs", "-1"), ("--jobs", "abc")]:
        fl(f"reproduce{flag}={v[:8]}", ["reproduce", "-q", "--paper", "ficco", flag, v] if flag != "--paper"
           else ["reproduce", "-q", flag, v])
    fl("list-bogus", ["list", "bogus"])
    fl("list-models", ["list", "models"], expect=0)
    fl("no-command", [])
    fl("bogus-command", ["frobnicate"])
    fl("calibrate-no-gpu", ["calibrate", "--quick", "--out", "o"])
    for flag, v in [("--device", "cuda:99"), ("--device", "bogus"), ("--gpu", "Z100"), ("--sections", "bogus"),
                    ("--kernel", "opencl")]:
        fl(f"calibrate{flag}={v}", ["calibrate", "--quick", flag, v, "--out", "o"])
    return cs


def output_cases() -> list[Case]:
    cs: list[Case] = []
    S = "outputs"
    base = ["--model", "llama-3-8b", "--cluster", "a40-pcie", "--nodes", "1", "--dp", "8", "--global-batch", "8",
            "--micro-batch", "1"]

    def oc(name, argv, setup=None, preserve=(), expect=None):
        cs.append(Case(S, name, argv, setup=setup, preserve=list(preserve), expect=expect))

    for cmd in ("simulate", "plan"):
        oc(f"{cmd}-out-is-file", [cmd, "-q", *base, "--out", "o"], sentinel("o"), ["o"])
        oc(f"{cmd}-out-through-file", [cmd, "-q", *base, "--out", "o/sub"], sentinel("o"), ["o"])
        oc(f"{cmd}-out-unwritable", [cmd, "-q", *base, "--out", "/proc/nope/x"])
        oc(f"{cmd}-out-long", [cmd, "-q", *base, "--out", "z" * 5000])
        oc(f"{cmd}-png-unwritable", [cmd, "-q", *base, "--out", "o", "--png", "/proc/nope/x.png"])
        oc(f"{cmd}-png-through-file", [cmd, "-q", *base, "--out", "o", "--png", "f/x.png"], sentinel("f"), ["f"])
        oc(f"{cmd}-png-is-dir", [cmd, "-q", *base, "--out", "o", "--png", "pd"], lambda d: (d / "pd").mkdir())
        oc(f"{cmd}-out-existing-ok", [cmd, "-q", *base, "--out", "o"], sentinel("o/keep.txt"), expect=0)
    oc("plan-emit-file", ["plan", "-q", *base, "--emit", "e"], sentinel("e"), ["e"])
    oc("plan-emit-through-file", ["plan", "-q", *base, "--emit", "e/x"], sentinel("e"), ["e"])
    oc("plan-emit-unwritable", ["plan", "-q", *base, "--emit", "/proc/nope/e"])
    oc("plan-emit-long", ["plan", "-q", *base, "--emit", "e" * 5000])
    oc("plan-emit-bad-strategy-keeps-env", ["plan", "-q", *base, "--emit", "e", "--strategy", "bogus"],
       sentinel("e/nccl.env"), ["e/nccl.env"])
    oc("plan-emit-bad-target-keeps-env", ["plan", "-q", *base, "--emit", "e", "--target", "jax"],
       sentinel("e/nccl.env"), ["e/nccl.env"])
    oc("plan-emit-ok", ["plan", "-q", *base, "--emit", "e"], expect=0)
    oc("plan-emit-nccl-env-is-dir", ["plan", "-q", *base, "--emit", "e"],
       both(lambda d: (d / "e" / "nccl.env").mkdir(parents=True), sentinel("e/keep")), ["e/keep"])
    oc("validate-write-cal-unwritable", ["validate", "runs.yaml", "-q", "--fit", "mem_bw_fraction", "--fit-on",
                                         "fit", "--write-calibration", "/proc/nope/c.json"], runs_file())
    oc("validate-write-cal-through-file", ["validate", "runs.yaml", "-q", "--fit", "mem_bw_fraction", "--fit-on",
                                           "fit", "--write-calibration", "f/c.json"], both(runs_file(), sentinel("f")),
       ["f"])
    oc("validate-write-cal-is-dir", ["validate", "runs.yaml", "-q", "--fit", "mem_bw_fraction", "--fit-on",
                                     "fit", "--write-calibration", "cd"], both(runs_file(),
                                                                               lambda d: (d / "cd").mkdir()))
    oc("calibrate-out-file", ["calibrate", "--refit", "cal.json", "--out", "o"], both(calib_file(), sentinel("o")),
       ["o"])
    return cs


def runs_cases() -> list[Case]:
    cs: list[Case] = []
    S = "runs"

    def rc(name, setup, *flags, expect=None, target="runs.yaml"):
        cs.append(Case(S, name, ["validate", target, "-q", *flags], setup=setup, expect=expect))

    rc("good", runs_file(), expect=0)
    rc("good-json", runs_file(), "--json", expect=0)
    rc("published", None, "--run", PUBLISHED["runs"][0]["name"], target="published", expect=0)
    rc("nonexistent", None)
    for nm, data in [("empty", ""), ("list", "- 1\n"), ("scalar", "3\n"), ("invalid", "runs: [\n"),
                     ("runs-str", "runs: x\n"), ("runs-empty", "runs: []\n"), ("runs-null", "runs:\n"),
                     ("runs-items-num", "runs: [1, 2]\n"), ("bom", "\ufeff" + yaml.safe_dump({"runs": []})),
                     ("binary", "\x00\xff")]:
        rc(nm, raw("runs.yaml", data))
    r0 = PUBLISHED["runs"][0]
    meas = [k for k in r0 if "measure" in k or "tflops" in k.lower() or "step" in k.lower()]
    for nm, key, v in [("name-missing", "runs.0.name", DEL), ("name-num", "runs.0.name", 5),
                       ("model-unknown", "runs.0.model", "bogus-model"), ("model-num", "runs.0.model", 3),
                       ("cluster-unknown", "runs.0.cluster", "bogus"), ("nodes-zero", "runs.0.nodes", 0),
                       ("nodes-str", "runs.0.nodes", "x"), ("tp-3", "runs.0.parallel.tp", 3),
                       ("dp-huge", "runs.0.parallel.dp", 10 ** 9), ("gb-zero", "runs.0.batch.global_batch", 0),
                       ("subset-bogus", "runs.0.subset", "train"), ("knobs-str", "runs.0.knobs", "x"),
                       ("model-hidden-neg", "runs.0.model.hidden", -1), ("model-heads-0", "runs.0.model.heads", 0),
                       ("model-layers-huge", "runs.0.model.layers", 2 ** 70)] + \
            [(f"{k}-{vn}", f"runs.0.{k}", v) for k in meas for vn, v in
             [("neg", -1), ("zero", 0), ("str", "fast"), ("nan", float("nan")), ("huge", 10 ** 400), ("del", DEL)]]:
        def mut(r, key=key, v=v):
            keys = key.split(".")
            cur = r
            for k in keys[:-1]:
                cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
            if v is DEL:
                cur.pop(keys[-1], None)
            else:
                cur[keys[-1]] = v
        rc(nm, runs_file(mut))

    def dup(r):
        r["runs"][1]["name"] = r["runs"][0]["name"]
    rc("dup-names", runs_file(dup))
    rc("alias-bomb", raw("runs.yaml", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                                      "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                                      "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
                                      "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nruns: *g\n"))
    for flag, v in [("--run", "bogus"), ("--run", r0["name"][:-2]), ("--run", HUGE), ("--subset", "bogus"),
                    ("--subset", "fit"), ("--fit", "bogus"), ("--fit", ""), ("--fit", "mem_bw_fraction,bogus"),
                    ("--fit-on", "bogus"), ("--jobs", "0"), ("--jobs", "-3"), ("--jobs", "abc"), ("--jobs", HUGE),
                    ("--calibration", "nope.json"), ("--calibration", "runs.yaml"), ("--calibration", "")]:
        rc(f"{flag}={v[:10]}", runs_file(), flag, v)
    rc("fit-no-fit-on", runs_file(), "--fit", "mem_bw_fraction")
    rc("fit-on-empty-subset", runs_file(lambda r: [x.update(subset="held-out") for x in r["runs"]]), "--fit",
       "mem_bw_fraction", "--fit-on", "fit")
    rc("write-cal-no-fit", runs_file(), "--write-calibration", "c.json")
    return cs


def calib_cases() -> list[Case]:
    cs: list[Case] = []
    S = "calibration"
    base = ["simulate", "-q", "--model", "llama-3-8b", "--cluster", "hgx-h200", "--nodes", "1", "--dp", "8",
            "--global-batch", "8", "--micro-batch", "1", "--calibration", "cal.json"]

    def cc_(name, setup, argv=None, expect=None):
        cs.append(Case(S, name, argv or base, setup=setup, expect=expect))

    cc_("good", calib_file(), expect=None)
    for nm, data in [("empty", ""), ("invalid", "{"), ("list", "[]"), ("null", "null"), ("yaml", "gpu: H200\n"),
                     ("bom", "\ufeff" + json.dumps(CALIB)), ("nan", json.dumps(CALIB).replace(
                         str(CALIB["params"]["mem_bw_fraction"]), "NaN"))]:
        cc_(nm, raw("cal.json", data))
    cc_("nonexistent", None)
    for nm, mut in [("gpu-missing", setitem("gpu", DEL)), ("gpu-unknown", setitem("gpu", "Z100")),
                    ("gpu-num", setitem("gpu", 5)), ("params-missing", setitem("params", DEL)),
                    ("params-list", setitem("params", [1])), ("param-neg", setitem("params.mem_bw_fraction", -0.5)),
                    ("param-zero", setitem("params.mem_bw_fraction", 0)),
                    ("param-gt1", setitem("params.mem_bw_fraction", 7.0)),
                    ("param-str", setitem("params.mem_bw_fraction", "high")),
                    ("param-null", setitem("params.mem_bw_fraction", None)),
                    ("param-huge", setitem("params.gemm_tile_m", 10 ** 30)),
                    ("param-tile-zero", setitem("params.gemm_tile_m", 0)),
                    ("param-unknown", setitem("params.bogus", 1.0)), ("version-99", setitem("version", 99)),
                    ("version-str", setitem("version", "x")), ("gpu-other", setitem("gpu", "A40"))]:
        cc_(nm, calib_file(mut))
    cc_("for-other-cluster", calib_file(), [a if a != "hgx-h200" else "a40-pcie" for a in base])
    for nm, setup in [("refit-nonexistent", None), ("refit-invalid", raw("cal.json", "{")),
                      ("refit-calibration", calib_file()), ("refit-empty", raw("cal.json", "{}")),
                      ("refit-list", raw("cal.json", "[1]"))]:
        cc_(nm, setup, ["calibrate", "--refit", "cal.json", "--out", "o", "-q"])
    cc_("add-without-measure", calib_file(), ["calibrate", "--add", "cal.json", "--out", "o", "-q"])
    cc_("refit-add-junk", both(calib_file(), raw("j.json", "{")),
        ["calibrate", "--refit", "cal.json", "--add", "j.json", "--out", "o", "-q"])
    cc_("plan-calibration-junk", raw("cal.json", "{"), ["plan", "-q", "--model", "llama-3-8b", "--cluster",
                                                       "hgx-h200", "--dp", "8", "--global-batch", "8", "--calibration", "cal.json"])
    cc_("validate-calibration-negparam", both(runs_file(), calib_file(setitem("params.mem_bw_fraction", -1))),
        ["validate", "runs.yaml", "-q", "--calibration", "cal.json"])
    return cs


def api_cases() -> list[Case]:
    cs: list[Case] = []
    S = "api"
    W = "model='llama-3-8b', cluster='a40-pcie', nodes=1, dp=8, global_batch=8, micro_batch=1"

    def ap(name, expr, setup=None):
        cs.append(Case(S, name, api=expr, setup=setup))

    ap("workload-good", f"cc.Workload({W})")
    for nm, v in [("np-int64", "np.int64(2)"), ("np-float", "np.float64(2.5)"), ("bool", "True"), ("none", "None"),
                  ("huge", "2**70"), ("str", "'2'"), ("float-int", "2.0"), ("neg", "-2"), ("zero", "0"),
                  ("nan", "float('nan')"), ("list", "[2]"), ("complex", "2j"), ("np-array", "np.array([2])"),
                  ("np-bool", "np.bool_(True)"), ("decimal", "__import__('decimal').Decimal(2)")]:
        ap(f"workload-tp={nm}", f"cc.Workload({W}, tp={v})")
    for kw, v in [("nodes", "np.int32(1)"), ("seq_len", "np.uint64(4096)"), ("global_batch", "True"),
                  ("model", "None"), ("model", "123"), ("cluster", "['a40-pcie']"), ("bogus", "1"),
                  ("knobs", "'x'"), ("knobs", "{'bogus': 1}"), ("knobs", "{'fsdp_prefetch': 'x'}"),
                  ("dtype", "'int3'"), ("data_parallel", "3"), ("framework", "5")]:
        kws = dict(part.split("=", 1) for part in W.split(", "))
        kws[kw] = v
        ap(f"workload-{kw}={v}", "cc.Workload(" + ", ".join(f"{k}={x}" for k, x in kws.items()) + ")")
    ap("workload-from-file-missing", "cc.Workload.from_file('nope.yaml')")
    ap("workload-from-file-int", "cc.Workload.from_file(5)")
    ap("workload-from-file-junk", "cc.Workload.from_file('c.yaml')", raw("c.yaml", "{"))
    ap("simulate-good", f"cc.simulate({W})")
    ap("simulate-np", f"cc.simulate({W.replace('dp=8', 'dp=np.int64(8)')})")
    ap("simulate-int", "cc.simulate(5)")
    ap("simulate-path", "cc.simulate(__import__('pathlib').Path('c.yaml'))", config_file())
    ap("simulate-missing", "cc.simulate('nope.yaml')")
    ap("simulate-wl-and-kw", f"cc.simulate(cc.Workload({W}), tp=2)")
    ap("simulate-dict", "cc.simulate({'model': 'llama-3-8b'})")
    ap("plan-good", f"cc.plan({W})")
    for nm, kw in [("strategies-int", "strategies=5"), ("strategies-bogus", "strategies=['bogus']"),
                   ("strategies-empty", "strategies=[]"), ("strategies-dict", "strategies={'a': 1}"),
                   ("exact-str", "exact='yes'"), ("exact-np", "exact=np.bool_(True)"), ("target-int", "target=3"),
                   ("target-bogus", "target='jax'"), ("strategy-bogus", "strategy='bogus'"),
                   ("strategy-int", "strategy=4")]:
        ap(f"plan-{nm}", f"cc.plan({W}, {kw})")
    ap("plan-emit-to-file", f"cc.plan({W}).emit('f')", sentinel("f"))
    ap("plan-emit-int", f"cc.plan({W}).emit(5)")
    ap("search-max-neg", f"cc.search({W}, max_simulations=-1)")
    ap("search-top-0", f"cc.search({W}, top=0)")
    ap("search-constraints-int", f"cc.search({W}, constraints=5)")
    ap("search-constraints-bad", f"cc.search({W}, constraints={{'tp': 'x'}})")
    ap("search-constraints-unknown", f"cc.search({W}, constraints={{'bogus': 2}})")
    ap("search-max-str", f"cc.search({W}, max_simulations='many')")
    ap("analyze-good", "cc.analyze('t')", good_traces)
    for nm, expr in [("none", "cc.analyze(None)"), ("int", "cc.analyze(123)"), ("empty-list", "cc.analyze([])"),
                     ("missing", "cc.analyze('nope')"), ("bytes", "cc.analyze(b't')"),
                     ("steps-int", "cc.analyze('t', steps=5)"), ("steps-none", "cc.analyze('t', steps=None)"),
                     ("steps-bad", "cc.analyze('t', steps='9-1')"),
                     ("steps-huge", "cc.analyze('t', steps='1-' + '9'*40)"),
                     ("jobs-str", "cc.analyze('t', jobs='x')"), ("jobs-neg", "cc.analyze('t', jobs=-1)"),
                     ("jobs-bool", "cc.analyze('t', jobs=True)"), ("jobs-np", "cc.analyze('t', jobs=np.int64(1))"),
                     ("jobs-float", "cc.analyze('t', jobs=1.5)"),
                     ("groups-str", "cc.analyze('t', groups='x')"), ("groups-intkeys", "cc.analyze('t', groups={1: 2})"),
                     ("groups-unknown", "cc.analyze('t', groups={'nope': 'dp'})"),
                     ("time-res-bad", "cc.analyze('t', time_resolution='x')"),
                     ("time-res-int", "cc.analyze('t', time_resolution=1)"),
                     ("list-with-int", "cc.analyze(['t', 5])"), ("generator", "cc.analyze(x for x in ['t'])")]:
        ap(f"analyze-{nm}", expr, good_traces)
    ap("analyze-bad-rank", "cc.analyze('t')", mutated(setitem("distributedInfo.rank", "²")))
    ap("analyze-junk-only", "cc.analyze('t')", raw_rank0(b"{", keep_rank1=False))
    ap("replay-good", "cc.replay('t')", good_traces)
    for nm, expr in [("whatifs-int", "cc.replay('t', whatifs=5)"), ("whatifs-bogus", "cc.replay('t', whatifs=['x'])"),
                     ("whatifs-empty", "cc.replay('t', whatifs=[])"), ("cluster-int", "cc.replay('t', cluster=5)"),
                     ("cluster-bogus", "cc.replay('t', cluster='bogus')"), ("steps-list", "cc.replay('t', steps=[1])"),
                     ("none", "cc.replay(None)")]:
        ap(f"replay-{nm}", expr, good_traces)
    ap("validate-good", "cc.validate('runs.yaml')", runs_file())
    for nm, expr in [("int", "cc.validate(5)"), ("none", "cc.validate(None)"), ("missing", "cc.validate('nope')"),
                     ("only-int", "cc.validate('runs.yaml', only=5)"),
                     ("only-bogus", "cc.validate('runs.yaml', only=['bogus'])"),
                     ("subset-int", "cc.validate('runs.yaml', subset=3)"),
                     ("subset-list", "cc.validate('runs.yaml', subset=['fit'])"),
                     ("jobs-0", "cc.validate('runs.yaml', jobs=0)"), ("jobs-str", "cc.validate('runs.yaml', jobs='x')"),
                     ("jobs-neg", "cc.validate('runs.yaml', jobs=-4)"),
                     ("jobs-huge", "cc.validate('runs.yaml', jobs=10**9)"),
                     ("junk-file", "cc.validate('j.yaml')")]:
        ap(f"validate-{nm}", expr, both(runs_file(), raw("j.yaml", "runs: [1]\n")))
    for nm, expr in [("papers-int", "cc.reproduce(papers=5)"), ("papers-bogus", "cc.reproduce(papers=['bogus'])"),
                     ("cases-bogus", "cc.reproduce(papers=['ficco'], cases=['bogus'])"),
                     ("jobs-neg", "cc.reproduce(papers=['ficco'], jobs=-1)"),
                     ("jobs-str", "cc.reproduce(papers=['ficco'], jobs='x')"),
                     ("papers-str", "cc.reproduce(papers='ficco')")]:
        ap(f"reproduce-{nm}", expr)
    return cs


def extra_cases() -> list[Case]:
    """Cases across surfaces: unicode, overrides, result methods, a few more paths."""
    cs: list[Case] = []
    W = "model='llama-3-8b', cluster='a40-pcie', nodes=1, dp=8, global_batch=8, micro_batch=1"
    base = ["--model", "llama-3-8b", "--cluster", "a40-pcie", "--nodes", "1", "--dp", "8", "--global-batch", "8",
            "--micro-batch", "1"]

    def cli(surface, name, argv, setup=None, expect=None, check=None, preserve=()):
        cs.append(Case(surface, name, argv, setup=setup, expect=expect, check=check, preserve=list(preserve)))

    def api(name, expr, setup=None):
        cs.append(Case("api", name, api=expr, setup=setup))

    for v in ["🦙", "\u202ellama", "llama-3-8b\n", " llama-3-8b ", "LLAMA-3-8B", "llama_3_8b"]:
        cli("flags", f"model={v!r}", ["simulate", "-q", *base[2:], "--model", v])
    cli("flags", "version", ["--version"], expect=0)
    cli("flags", "list-json", ["list", "models", "--json"], expect=0)
    cli("flags", "simulate-config-and-flag", ["simulate", "-q", "--json", "--config", "c.yaml", "--tp", "2"],
        config_file())
    cli("flags", "simulate-config-and-bad-flag", ["simulate", "-q", "--config", "c.yaml", "--nodes", "0"],
        config_file())
    cli("config", "cluster-toml-partial-gpu", ["simulate", "-q", "--model", "llama-3-8b", "--cluster", "cl.toml",
                                               "--dp", "16", "--global-batch", "16"],
        raw("cl.toml", 'name = "x"\nnodes = 2\ngpus_per_node = 8\n[gpu]\nname = "G"\n'))
    cli("config", "cluster-toml-good", ["simulate", "-q", "--model", "llama-3-8b", "--cluster", "cl.toml",
                                        "--dp", "32", "--global-batch", "32"],
        raw("cl.toml", (ROOT / "examples" / "my-cluster.toml").read_text()), expect=0)
    cli("config", "cluster-toml-gpus-zero", ["simulate", "-q", "--model", "llama-3-8b", "--cluster", "cl.toml",
                                             "--dp", "32", "--global-batch", "32"],
        raw("cl.toml", (ROOT / "examples" / "my-cluster.toml").read_text().replace("gpus_per_node = 8",
                                                                                     "gpus_per_node = 0")))
    cli("config", "model-dict-nan-json", ["simulate", "-q", "--config", "c.json"],
        config_file(setitem("model", {"name": "x", "hidden": float("nan"), "heads": 32, "layers": 2, "vocab": 1000,
                                      "ffn_hidden": 1000, "seq_len": 4096}), fmt="json"))
    cli("config", "model-heads-not-dividing-hidden", ["simulate", "-q", "--config", "c.yaml"],
        config_file(setitem("model", {"name": "x", "hidden": 4096, "heads": 33, "kv_heads": 33, "layers": 2,
                                      "vocab": 1000, "ffn_hidden": 1000, "seq_len": 4096})))
    cli("config", "yaml-dup-key", ["simulate", "-q", "--config", "c.yaml"],
        raw("c.yaml", yaml.safe_dump(CONFIG) + "nodes: 4\n"))
    cli("trace", "analyze:two-paths", ["analyze", "-q", "t/rank-0.json", "t/rank-1.json"], good_traces, expect=0)
    cli("trace", "analyze:same-file-twice", ["analyze", "-q", "t/rank-0.json", "t/rank-0.json"], good_traces)
    cli("trace", "analyze:world-10000", ["analyze", "-q", "t"],
        mutated(setitem("distributedInfo.world_size", 10000), rank0_only=False))
    cli("trace", "analyze:ts-string-1e400", ["analyze", "-q", "t"], mutated(
        lambda o: [e.update(ts="1e400") for e in kernels(o)]))
    cli("trace", "analyze:only-metadata", ["analyze", "-q", "t"], mutated(
        lambda o: o.update(traceEvents=[{"ph": "M", "name": "x", "pid": i, "tid": i} for i in range(200000)])))
    cli("trace", "replay:cluster-a40", ["replay", "-q", "--json", "t", "--cluster", "a40-pcie"], good_traces,
        expect=0, check=check_replay)
    cli("trace", "replay:gz-bomb", ["replay", "-q", "t"], raw_rank0(
        gzip.compress(b'{"traceEvents": [' + b" " * (300 << 20) + b"]}", 9), "rank-0.json.gz"))
    cli("trace", "analyze:vs-gz-bomb", ["analyze", "-q", "t", "--vs", "u"], both(good_traces, raw(
        "u/rank-0.json.gz", gzip.compress(b'{"traceEvents": [' + b" " * (300 << 20) + b"]}", 9))))
    cli("outputs", "tune-emit-keeps-env-on-bad-group", ["tune", "-q", "--group", "g.yaml", "--emit", "e"],
        both(raw("g.yaml", "name: x\n"), sentinel("e/nccl.env")), preserve=["e/nccl.env"])
    cli("outputs", "plan-emit-lagom-ok", ["plan", "-q", *base, "--emit", "e", "--strategy", "lagom"], expect=0)
    cli("outputs", "calibrate-refit-out-through-file", ["calibrate", "--refit", "cal.json", "--out", "f/x.json"],
        both(calib_file(), sentinel("f")), preserve=["f"])
    cli("outputs", "simulate-gzip-out-existing", ["simulate", "-q", *base, "--gzip", "--out", "o"],
        sentinel("o/rank-0.json.gz"))
    api("analyze-path", "cc.analyze(__import__('pathlib').Path('t'))", good_traces)
    api("analyze-tuple", "cc.analyze(('t/rank-0.json', 't/rank-1.json'))", good_traces)
    api("search-constraints-np", f"cc.search({W}, constraints={{'tp': np.int64(1)}}, max_simulations=4)")
    api("plan-emit-bogus-strategy", f"cc.plan({W}).emit('e', strategy='bogus')")
    api("plan-emit-bogus-target", f"cc.plan({W}).emit('e', target='jax')")
    api("plan-hints-bogus-target", f"cc.plan({W}).apply_hints(target=None)")
    api("plan-to-dataframe", f"cc.plan({W}).to_dataframe()")
    api("workload-from-file-kw", "cc.Workload.from_file('c.yaml', tp=np.int64(2), dp=8)", config_file())
    api("workload-from-file-bad-kw", "cc.Workload.from_file('c.yaml', bogus=2)", config_file())
    api("simulate-calibration-other-gpu", f"cc.simulate({W}, calibration='cal.json')", calib_file())
    api("replay-whatifs-tuple", "cc.replay('t', whatifs=('no-comm',))", good_traces)
    api("validate-published-only", "cc.validate('published', only='bogus')")
    api("reproduce-cases-str", "cc.reproduce(papers=['ficco'], cases='ficco-best-1d')")
    api("analyze-groups-np-key", "cc.analyze('t', groups={np.str_('0'): 'dp'})", good_traces)
    return cs


SURFACES = {"trace": trace_cases, "config": config_cases, "flags": flag_cases, "outputs": output_cases,
            "runs": runs_cases, "calibration": calib_cases, "api": api_cases,
            "extra": extra_cases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="cases at a time (default 2)")
    ap.add_argument("--only", action="append", choices=sorted(SURFACES), help="only this surface (repeatable)")
    ap.add_argument("--filter", help="only cases whose name contains this text")
    ap.add_argument("--json", help="write every case's verdict to this JSON file")
    ap.add_argument("--rerun", help="only the cases with defects in this earlier --json file")
    ap.add_argument("--keep", action="store_true", help="keep the cases' directories (printed)")
    args = ap.parse_args(argv)
    cases = [c for s in (args.only or SURFACES) for c in SURFACES[s]()]
    if args.filter:
        cases = [c for c in cases if args.filter in c.name]
    if args.rerun:
        again = {(v["surface"], v["name"]) for v in json.loads(Path(args.rerun).read_text()) if v["defects"]}
        cases = [c for c in cases if (c.surface, c.name) in again]
    base = Path(tempfile.mkdtemp(prefix="ccoverlap-hostile-"))
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_case(c, base), cases))
    wall = time.monotonic() - t0
    per = Counter(c.surface for c in cases)
    bad = Counter()
    verdicts = []
    for case, probs, dt, rc in results:
        verdicts.append({"surface": case.surface, "name": case.name, "argv": case.argv, "api": case.api,
                         "exit": rc, "seconds": round(dt, 2), "defects": probs})
        if probs:
            bad[case.surface] += 1
            what = " ".join(case.argv) if case.argv is not None else case.api
            print(f"DEFECT {case.surface}/{case.name}: {'; '.join(probs)}\n    {what[:300]}")
    print(f"\n{'surface':<12} {'cases':>6} {'defects':>8}")
    for s in per:
        print(f"{s:<12} {per[s]:>6} {bad[s]:>8}")
    print(f"{'all':<12} {sum(per.values()):>6} {sum(bad.values()):>8}   ({wall:.0f} s wall, {args.jobs} at a time)")
    slow = sorted(results, key=lambda r: -r[2])[:3]
    print("slowest: " + ", ".join(f"{c.surface}/{c.name} {dt:.1f} s" for c, _, dt, _ in slow))
    if args.json:
        Path(args.json).write_text(json.dumps(verdicts, indent=1))
    if args.keep:
        print(f"case directories: {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
