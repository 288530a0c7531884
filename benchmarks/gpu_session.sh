#!/usr/bin/env bash
# Every GPU check on one CUDA GPU, in three parts of at most ~10 minutes each (docs/gpu-checks.md).
#
#   OUT=/some/folder bash benchmarks/gpu_session.sh part1   # calibrate, full plan (call again if unfinished)
#   OUT=/some/folder bash benchmarks/gpu_session.sh part2   # pytest -m gpu, bench + analyze on CUDA
#   OUT=/some/folder bash benchmarks/gpu_session.sh part3   # held-out GEMM sweep, FiCCO pieces
#   OUT=/some/folder bash benchmarks/gpu_session.sh all     # the three in a row (no 10-minute limit)
#   OUT=/some/folder bash benchmarks/gpu_session.sh short   # the essentials in ONE call (CCOV_BUDGET_S, default 450)
#   bash benchmarks/gpu_session.sh --plan                   # print the steps and budgets, run nothing
#
# Run from the repository root. Each part stays under CCOV_BUDGET_S seconds (default 540: the
# device tool allows 600 per command): every step gets a timeout from what is left, and a step
# that no longer fits is skipped and says so. Everything a part writes goes to $CCOV_WORK
# (default /tmp/ccov-gpu/<part>) and is packed into at most 8 files under $OUT: <part>.tar.gz
# (all logs, JSON, Markdown, traces; split into 15 MiB pieces if larger) plus the key files
# flat (the calibration file, the tables, the pytest log, <part>-summary.md).
# Wheels in .whl/ (msgspec: faster trace reading; optional) are installed into /tmp/site.
set -u -o pipefail

PART="${1:-all}"
PY="${PYTHON:-python3}"
DEFAULT_BUDGET=540; [ "$PART" = "short" ] && DEFAULT_BUDGET=450
BUDGET_S="${CCOV_BUDGET_S:-$DEFAULT_BUDGET}"
RESERVE_S=25   # kept for packing
BENCH_SIZE="${CCOV_BENCH_SIZE:-8192}"        # M = N = K of the CUDA bench run
PYTEST_TARGET="${CCOV_PYTEST_TARGET:-tests}"  # what pytest -m gpu collects
POLL_S="${CCOV_POLL_S:-10}"                   # how often a wait looks at the background calibration
CAL_MEASURE_S="${CCOV_CAL_MEASURE_S:-240}"    # short: the longest the calibration may measure
FLAT_MAX=6     # files copied flat into $OUT besides the tar.gz (8 files at most come back)

case "$PART" in
  part1|part2|part3|all|short|--plan) ;;
  *) echo "gpu_session.sh: unknown part '$PART' (use part1, part2, part3, all, short or --plan)" >&2; exit 2 ;;
esac
if [ "$PART" = "--plan" ]; then
  cat <<'EOF'
part1  env.txt; ccoverlap calibrate --out calibration.json (full plan) detached with setsid,
       waited for while the budget lasts; call part1 again to wait on if it is not done;
       if it fails and >= 150 s are left: ccoverlap calibrate --quick
part2  env.txt; pytest -m gpu (<= 300 s); ccoverlap bench --nproc 1 (CUDA, NCCL, --profile-dir) and
       ccoverlap analyze of its trace (<= 150 s together)
part3  env.txt; benchmarks/gpu_gemm_vs_model.py (<= 240 s; --calibration calibrations/*.json if one is
       committed for this GPU); benchmarks/gpu_ficco_pieces.py (what is left)
each part: budget CCOV_BUDGET_S (default 540 s), 25 s kept for packing into $OUT (<= 8 files)
short  one call (budget 450 s): env.txt; ccoverlap calibrate --quick --kernel triton detached,
       waited for until its measurements are written (<= 240 s, then stopped), its fit left running;
       benchmarks/gpu_layer_trace.py (<= 60 s); pytest -m gpu without the end-to-end quick
       calibration that the first step is (<= 150 s); benchmarks/gpu_gemm_vs_model.py (<= 90 s);
       benchmarks/gpu_ficco_pieces.py (what is left); then the fit is waited for
EOF
  exit 0
fi
if [ -z "${OUT:-}" ]; then
  echo "gpu_session.sh: set OUT to the folder whose files come back" >&2; exit 2
fi
if [ ! -f ccoverlap/__init__.py ] || [ ! -d benchmarks ]; then
  echo "gpu_session.sh: run it from the repository root (no ccoverlap/ here: $PWD)" >&2; exit 2
fi

export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
ROOT_W="${CCOV_WORK:-/tmp/ccov-gpu}"
mkdir -p "$OUT" "$ROOT_W"

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*"; }
left() { echo $(( BUDGET_S - RESERVE_S - ($(date +%s) - START) )); }

# ---- carried wheels (msgspec) ----------------------------------------------------------
if ls .whl/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
    log "installed $(ls .whl/*.whl | xargs -n1 basename | tr '\n' ' ')into /tmp/site"
  else
    log "WARNING: could not install the wheels in .whl/ (traces are read with the slower stdlib decoder)"
  fi
fi

# step NAME MAX_S CMD...: run CMD with a timeout of min(MAX_S, what is left), output to NAME.log;
# one status line per step in steps.tsv and on stdout (with the log's last lines on failure).
step() {
  local name="$1" max="$2"; shift 2
  local t; t=$(left); [ "$t" -gt "$max" ] && t="$max"
  if [ "$t" -lt 20 ]; then
    log "SKIP $name: out of budget ($(left) s left)"; printf '%s\tskipped\t0\n' "$name" >>"$W/steps.tsv"; return 3
  fi
  log "run  $name (timeout ${t}s): $*"
  local s; s=$(date +%s)
  timeout -k 10 "$t" "$@" >"$W/logs/$name.log" 2>&1
  local rc=$?
  local d=$(( $(date +%s) - s ))
  printf '%s\t%s\t%s\n' "$name" "$rc" "$d" >>"$W/steps.tsv"
  if [ "$rc" -eq 0 ]; then log "done $name in ${d}s"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then log "TIMEOUT $name after ${d}s"; tail -n 5 "$W/logs/$name.log"
  else log "FAIL $name (exit $rc) after ${d}s"; tail -n 15 "$W/logs/$name.log"
  fi
  return "$rc"
}

env_info() {
  {
    echo "# environment ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || cat .whl/commit.txt 2>/dev/null || echo unknown)"
    echo "uname: $(uname -a)"; echo "cpus: $(nproc)"; free -g 2>/dev/null | head -2
    echo "--- nvidia-smi"; nvidia-smi 2>&1 | head -25
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,persistence_mode --format=csv 2>&1
    echo "--- nvcc"; nvcc --version 2>&1 | tail -2
    echo "--- python"
    "$PY" - <<'PYEOF' 2>&1
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "sms", p.multi_processor_count, "mem GiB", round(p.total_memory / 2**30, 1),
          "L2 MiB", round(getattr(p, "L2_cache_size", 0) / 2**20, 1), "cc", f"{p.major}.{p.minor}",
          "count", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())
for name in ("triton", "numpy", "matplotlib", "rich", "yaml", "msgspec", "hypothesis", "pytest", "pytest_timeout", "ninja"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "present"))
    except Exception as exc:
        print(name, "MISSING", type(exc).__name__)
from ccoverlap.trace import jsonstream
print("trace decoder:", "msgspec" if jsonstream.msgspec is not None else "stdlib json (msgspec missing)")
PYEOF
    echo "--- load"; uptime
  } >"$W/env.txt" 2>&1
  log "environment: $(grep -m1 '^device' "$W/env.txt" || echo 'no CUDA device seen')"
}

# ---- packing ---------------------------------------------------------------------------
pack() {
  local part="$1"
  {
    echo "# $part summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(( $(date +%s) - START )) s)"
    echo; echo '```'; grep -E '^(commit|device|torch|trace decoder)' "$W/env.txt" 2>/dev/null; echo '```'
    echo; echo "| step | exit | seconds |"; echo "| :-- | --: | --: |"
    awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}' "$W/steps.tsv" 2>/dev/null
    for f in "$W"/logs/*.log; do
      [ -f "$f" ] || continue
      echo; echo "## tail of $(basename "$f")"; echo '```'; tail -n 25 "$f"; echo '```'
    done
  } >"$W/$part-summary.md"
  local flat=("$W/$part-summary.md")
  for f in "$W"/*.json "$W"/*.md "$W/logs/pytest-gpu.log"; do
    case "$f" in *-summary.md|*"*"*) continue ;; esac
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -lt 15000000 ] && flat+=("$f")
  done
  # at most FLAT_MAX flat files: the tar.gz (1, or 2 when split) comes on top, 8 in all
  local n=0
  for f in "${flat[@]}"; do
    [ "$n" -ge "$FLAT_MAX" ] && { log "not copied flat (it is in the tar): $(basename "$f")"; continue; }
    cp "$f" "$OUT/" && n=$((n + 1))
  done
  tar -C "$W" -czf "/tmp/$part.tar.gz" . 2>/dev/null
  local size; size=$(stat -c %s "/tmp/$part.tar.gz")
  if [ "$size" -gt 15728640 ]; then
    split -b 15M -d -a 1 "/tmp/$part.tar.gz" "$OUT/$part.tar.gz."
    log "packed $part.tar.gz ($size bytes) in pieces: cat $part.tar.gz.* > $part.tar.gz"
  else
    mv "/tmp/$part.tar.gz" "$OUT/"
    log "packed $part.tar.gz ($size bytes)"
  fi
  ls -la "$OUT"
}

# ---- the parts -------------------------------------------------------------------------
# The full calibration may outlast one call: it runs detached (setsid), which
# the device machine lets live on after the call returns, in $CAL (kept across parts). part1
# waits for it as long as its budget allows; calling part1 again at once (the machine goes
# back after 30 s idle, and the run with it) waits on; part2 and part3 wait for it before
# they touch the GPU.
CAL="$ROOT_W/calibrate-bg"

# start_calibration [OPTIONS]: `ccoverlap calibrate OPTIONS --out $CAL/calibration.json` detached
# (setsid), its log, pid, start time and, when it ends, its exit code in $CAL
start_calibration() {
  rm -rf "$CAL"; mkdir -p "$CAL"
  log "run  calibrate detached: $PY -m ccoverlap calibrate $* --out $CAL/calibration.json"
  date +%s >"$CAL/start"
  setsid nohup bash -c "'$PY' -m ccoverlap calibrate $* --out '$CAL/calibration.json' >'$CAL/calibrate.log' 2>&1; echo \$? >'$CAL/rc.tmp'; mv '$CAL/rc.tmp' '$CAL/rc'" \
    </dev/null >/dev/null 2>&1 &
  echo $! >"$CAL/pid"
}

cal_running() { [ -f "$CAL/pid" ] && [ ! -f "$CAL/rc" ] && kill -0 "$(cat "$CAL/pid")" 2>/dev/null; }

wait_calibration() {  # wait_calibration MAX_S
  local max="$1" s; s=$(date +%s)
  while cal_running; do
    if [ $(( $(date +%s) - s )) -ge "$max" ] || [ "$(left)" -le 0 ]; then return 1; fi
    sleep "$POLL_S"
    [ $(( ($(date +%s) - s) % 60 )) -lt "$POLL_S" ] && log "calibrate: $(tail -n 1 "$CAL/calibrate.log" 2>/dev/null | cut -c1-150)"
  done
  return 0
}

part1() {
  if cal_running; then
    log "calibration already running (pid $(cat "$CAL/pid")): waiting for it"
  elif [ -f "$CAL/rc" ]; then
    log "calibration finished in an earlier call (exit $(cat "$CAL/rc"))"
  else
    start_calibration
  fi
  if ! wait_calibration "$(left)"; then
    log "calibrate is STILL RUNNING (log: $CAL/calibrate.log); call part1 again now to wait on and collect it"
    printf 'calibrate\tstill-running\t%s\n' $(( $(date +%s) - $(cat "$CAL/start") )) >>"$W/steps.tsv"
    cp "$CAL/calibrate.log" "$W/logs/calibrate.log" 2>/dev/null
    return
  fi
  local rc; rc=$(cat "$CAL/rc" 2>/dev/null || echo lost)
  printf 'calibrate\t%s\t%s\n' "$rc" $(( $(stat -c %Y "$CAL/rc" 2>/dev/null || date +%s) - $(cat "$CAL/start") )) >>"$W/steps.tsv"
  cp "$CAL/calibrate.log" "$W/logs/calibrate.log" 2>/dev/null
  log "calibrate finished (exit $rc)"
  if [ "$rc" != 0 ] && [ "$(left)" -ge 150 ]; then
    log "full calibration failed: quick plan instead (say so in the docs)"
    step calibrate-quick 600 "$PY" -m ccoverlap calibrate --quick --out "$CAL/calibration-quick.json"
  fi
  for f in "$CAL/calibration.json" "$CAL/calibration-quick.json"; do
    [ -f "$f" ] || continue
    local gpu; gpu=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['gpu'].lower())" "$f" 2>/dev/null)
    local suffix=""; [ "$f" = "$CAL/calibration.json" ] || suffix="-quick"
    cp "$f" "$W/${gpu:-calibration}${suffix}.json"
  done
  grep -iE 'held-out|heldout|median|fit_error|group|wrote' "$W/logs/calibrate.log" 2>/dev/null | tail -n 30
}

part2() {
  wait_calibration $(( BUDGET_S / 2 )) || { log "calibration still running: part2 not started (GPU busy)"; return; }
  step pytest-gpu 300 "$PY" -m pytest -p no:cacheprovider -m gpu -rs $PYTEST_TARGET
  tail -n 15 "$W/logs/pytest-gpu.log"
  mkdir -p "$W/bench-trace"
  step bench-cuda 120 "$PY" -m ccoverlap bench --nproc 1 --m "$BENCH_SIZE" --n "$BENCH_SIZE" --k "$BENCH_SIZE" --iters 5 --warmup 2 \
    --profile-dir "$W/bench-trace" --json
  [ -f "$W/logs/bench-cuda.log" ] && cp "$W/logs/bench-cuda.log" "$W/bench-cuda.txt"
  if ls "$W"/bench-trace/*.json >/dev/null 2>&1; then
    step analyze-bench 60 "$PY" -m ccoverlap analyze "$W/bench-trace" --png "$W/bench-trace/analyze.png"
    step analyze-bench-json 60 "$PY" -m ccoverlap analyze "$W/bench-trace" --json --no-png
    du -b "$W"/bench-trace/* | sed 's/^/  trace /'
  fi
}

part3() {
  wait_calibration $(( BUDGET_S / 2 )) || { log "calibration still running: part3 not started (GPU busy)"; return; }
  # the calibration file of this GPU (its "gpu" field = the catalog GPU of the device), a full
  # one before a -quick one; none: predictions with the default parameters only
  local calarg=()
  local c; c=$("$PY" - 2>/dev/null <<'PYEOF'
import glob, json
import torch
from ccoverlap.calibrate.microbench import catalog_gpu
gpu = catalog_gpu(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
for f in sorted(glob.glob("calibrations/*.json"), key=lambda f: ("-quick" in f, f)):
    try:
        if gpu and json.load(open(f)).get("gpu") == gpu:
            print(f)
            break
    except (OSError, ValueError, AttributeError):
        pass
PYEOF
)
  if [ -n "$c" ]; then calarg=(--calibration "$c"); log "calibration for the second prediction: $c"
  else log "no calibrations/*.json for this GPU: default parameters only (re-predict later with --from-json)"; fi
  step gemm-vs-model 240 "$PY" benchmarks/gpu_gemm_vs_model.py --out "$W" "${calarg[@]}"
  tail -n 12 "$W/logs/gemm-vs-model.log"
  step ficco-pieces 600 "$PY" benchmarks/gpu_ficco_pieces.py --out "$W" "${calarg[@]}"
  tail -n 8 "$W/logs/ficco-pieces.log"
}

# short: what one short device call can hold, most important first. The calibration's fit
# (CPU only) runs on while the GPU does the rest; --refit redoes it anywhere if it is cut short.
short() {
  start_calibration --quick --kernel triton
  local s; s=$(date +%s)
  while cal_running && ! grep -q "fitting" "$CAL/calibrate.log" 2>/dev/null; do
    if [ $(( $(date +%s) - s )) -ge "$CAL_MEASURE_S" ]; then  # stop it: the other steps would disturb its timings
      log "calibrate still measuring after $CAL_MEASURE_S s: stopped; its finished sections are in the file (refit it)"
      kill -- -"$(cat "$CAL/pid")" 2>/dev/null; sleep 1; break
    fi
    sleep 2
  done
  log "calibrate: $(tail -n 1 "$CAL/calibrate.log" 2>/dev/null | cut -c1-150)"
  mkdir -p "$W/layer"
  step layer-trace 60 "$PY" benchmarks/gpu_layer_trace.py --out "$W/layer"
  step pytest-gpu 150 "$PY" -m pytest -p no:cacheprovider -m gpu -rs --timeout 120 \
    -k "not quick_calibration_end_to_end" $PYTEST_TARGET
  tail -n 15 "$W/logs/pytest-gpu.log"
  step gemm-vs-model 90 "$PY" benchmarks/gpu_gemm_vs_model.py --out "$W"
  tail -n 12 "$W/logs/gemm-vs-model.log"
  local t; t=$(( $(left) - 30 ))
  [ "$t" -ge 20 ] && step ficco-pieces "$t" "$PY" benchmarks/gpu_ficco_pieces.py --out "$W"
  wait_calibration "$(left)" || log "calibrate's fit still running: the measurements are in the file (refit it)"
  cp "$CAL/calibrate.log" "$W/logs/calibrate.log" 2>/dev/null
  local crc; crc=$(cat "$CAL/rc" 2>/dev/null) || { cal_running && crc=running || crc=stopped; }
  printf 'calibrate\t%s\t%s\n' "$crc" $(( $(date +%s) - $(cat "$CAL/start") )) >>"$W/steps.tsv"
  [ -f "$CAL/calibration.json" ] && cp "$CAL/calibration.json" "$W/calibration.json"
}

run_part() {
  local part="$1"
  W="$ROOT_W/$part"; rm -rf "$W"; mkdir -p "$W/logs"; : >"$W/steps.tsv"
  log "=== $part: budget ${BUDGET_S}s, work folder $W"
  env_info
  "$part"
  pack "$part"
  log "=== $part finished"
}

if [ "$PART" = "all" ]; then
  BUDGET_S=$(( BUDGET_S * 3 ))
  FLAT_MAX=1   # three parts into one $OUT: each part's summary and tar.gz only (6 files)
  for p in part1 part2 part3; do run_part "$p"; done
else
  run_part "$PART"
fi
