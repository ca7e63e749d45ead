#!/usr/bin/env bash
# Pipelined-run benchmark (run by hand, not in CI): does `ftpipe run` hide
# the conversion under the download? Against nginx on loopback with a
# per-connection cap (limit_rate, as bench/fetch.sh's capped link), serving
# a Qwen4-Exp ModelOpt NVFP4 export in the released layout (the demo's shape
# with --layers layers, ~27 MB each, one shard per 4 layers: real-sized rows,
# few tensors; or with --experts N a tiny-dims one with N experts per layer,
# ~3k tensors per layer, whose index and headers are a large part of its
# bytes), each round times, in one invocation:
#   * fetch    `ftpipe fetch` alone (the floor);
#   * convert  `ftpipe convert` of that fetched directory (today's second half);
#   * run      `ftpipe run` from nothing (the fetch drives the conversion);
#   * budget   `ftpipe run --disk-budget` at the minimum `plan` reports.
# and prints run / fetch, budget / fetch and (fetch + convert) / fetch, plus
# convert / fetch (issue 39's goals apply when it is at least 0.30). Every run's
# manifest must be the same.
#
#   bench/pipelined.sh [--experts N] [--layers N] [--ple-own-files] [--cap MBPS] [--connections N] [--rounds N] [--cache DIR] [--work DIR] [--baseline BIN] [--server-rt]
#
# --connections N is passed to every fetch and run (default: ftpipe's, 8).
# The fetch alone and the unbudgeted run never have more requests in flight
# than files (--jobs, 4): the shards are below --segment-threshold. A
# budgeted run splits the few shards it admits into ranges over every free
# connection, so --connections 4 compares it at the same number of
# connections as the others.
#
# --baseline BIN also times `BIN run` (another build, e.g. the one before a
# change) in every round, after this build's run in odd rounds and before it
# in even ones, and prints its ratio beside it: a change measured against
# its baseline in one invocation.
#
# --server-rt runs nginx under the real-time FIFO class (chrt -f 50; needs
# root or CAP_SYS_NICE): its pacing timers fire on time even while the
# conversion keeps both cores busy, as a server on its own machine would.
# Without it the server shares the two cores with ftpipe.
#
# --budget-args "ARGS" adds ARGS to the budgeted run only (an experiment's
# setting, e.g. "--split-below-rate 0").
#
# --ple-own-files puts each PLE shard of the demo shape in a file of its own
# (the released layouts' PLE files are mostly PLE table); without it the
# 4 PLE shards sit in 4 of the text shards.
#
# Needs: nginx, python3, curl. Generated data is kept in CACHE (default
# ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}); the fetched and converted
# directories go to --work DIR (default CACHE/pipelined-work; e.g. a tmpfs,
# to take the disk and its writeback out of the comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
EXPERTS=
LAYERS=24
OWN=
CONNECTIONS=
BUDGET_ARGS=
CAP_MBPS=20
ROUNDS=2
CACHE=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}
WORK=
BASE=
SERVER=()
while (($#)); do
  case $1 in
    --experts) EXPERTS=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --ple-own-files) OWN=1; shift ;;
    --cap) CAP_MBPS=$2; shift 2 ;;
    --connections) CONNECTIONS=$2; shift 2 ;;
    --budget-args) BUDGET_ARGS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --baseline) BASE=$2; shift 2 ;;
    --server-rt) SERVER=(chrt -f 50); shift ;;
    -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
cargo build --release -q --bin ftpipe && cargo build --release -q -p ftpipe-fixtures --bin fixture-hub
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
FT=$TARGET/release/ftpipe
HUB=$TARGET/release/fixture-hub
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[[ -x $NGINX ]] || { echo "nginx not found (Debian: apt-get install nginx-light)" >&2; exit 2; }
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ -n $EXPERTS ]]; then
  SRC=$CACHE/pipelined-$EXPERTS-$LAYERS; GEN=(--release-experts "$EXPERTS" --release-layers "$LAYERS")
else
  SRC=$CACHE/pipelined-demo-$LAYERS${OWN:+-own}; GEN=(--release-demo --release-layers "$LAYERS")
  [[ -n $OWN ]] && GEN+=(--release-ple-own-files)
fi
if [[ ! -f $SRC/ready ]]; then
  echo "== generating the export into $SRC (once)"
  rm -rf "$SRC"; mkdir -p "$SRC"
  "$HUB" --dir "$SRC/repo" "${GEN[@]}" >"$SRC/hub.env" 2>"$SRC/hub.err" &
  gen=$!
  while ! grep -q ENDPOINT "$SRC/hub.env" 2>/dev/null; do sleep 0.2; done
  kill "$gen"; wait "$gen" 2>/dev/null || true
  touch "$SRC/ready"
fi

WORK=${WORK:-$CACHE/pipelined-work}
rm -rf "$WORK"; mkdir -p "$WORK"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 bench/static_hub.py "$WORK/nginx" "$PORT" "acme/pipelined=pipelined:$SRC/repo:$CAP_MBPS"
"${SERVER[@]}" "$NGINX" -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" 2>"$WORK/nginx.stderr" &
NGINX_PID=$!
trap 'kill $NGINX_PID 2>/dev/null || true' EXIT
EP=http://127.0.0.1:$PORT
up=
for _ in $(seq 100); do curl -sf -o /dev/null "$EP/api/models/acme/pipelined/revision/main" && { up=1; break; }; sleep 0.05; done
[[ -n $up ]] || { echo "nginx did not answer at $EP:" >&2; cat "$WORK/nginx.stderr" >&2; exit 1; }
TOTAL=$(awk -F'\t' '{s+=$2} END {printf "%.0f", s}' "$WORK/nginx/pipelined.files")
echo "== acme/pipelined: $(wc -l <"$WORK/nginx/pipelined.files") files, $TOTAL bytes; nginx limit_rate ${CAP_MBPS} MB/s per connection${SERVER:+, under chrt -f 50}"

COMMON=(--endpoint "$EP" --quiet)
[[ -n $CONNECTIONS ]] && COMMON+=(--connections "$CONNECTIONS")
echo "== connections: ${CONNECTIONS:-the default}"
MIN=$("$FT" plan acme/pipelined --remote --endpoint "$EP" --out "$WORK/plan" --disk-budget 1TB --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["disk_budget"]["minimum_budget"])')
echo "== minimum feasible budget: $MIN bytes"

# timed NAME CMD...: wall seconds of CMD into $WORK/NAME.times (one line per round).
timed() {
  local name=$1; shift
  cat "$SRC"/repo/* >/dev/null 2>&1 || true # the server has the data in RAM
  local t0 t1
  t0=$(date +%s.%N); "$@"; sync; t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')" | tee -a "$WORK/$name.times" | sed "s/^/   $name: /"
}
sha() { sha256sum "$1/artifact/manifest.json" | cut -d' ' -f1; }

for r in $(seq "$ROUNDS"); do
  echo "== round $r"
  rm -rf "$WORK/f" "$WORK/r" "$WORK/b" "$WORK/rb"
  timed fetch "$FT" fetch acme/pipelined --out "$WORK/f" "${COMMON[@]}"
  timed convert "$FT" convert --out "$WORK/f" --quiet
  # The baseline's run goes after this build's in odd rounds and before it
  # in even ones, so neither always follows the other's writeback.
  ((r % 2)) && timed run "$FT" run acme/pipelined --out "$WORK/r" "${COMMON[@]}"
  if [[ -n $BASE ]]; then
    timed run-baseline "$BASE" run acme/pipelined --out "$WORK/rb" "${COMMON[@]}"
    [[ $(sha "$WORK/rb") == $(sha "$WORK/f") ]] || { echo "the baseline's manifest differs"; exit 1; }
    rm -rf "$WORK/rb"
  fi
  ((r % 2)) || timed run "$FT" run acme/pipelined --out "$WORK/r" "${COMMON[@]}"
  timed budget "$FT" run acme/pipelined --out "$WORK/b" --disk-budget "$MIN" "${COMMON[@]}" $BUDGET_ARGS
  [[ $(sha "$WORK/f") == $(sha "$WORK/r") && $(sha "$WORK/r") == $(sha "$WORK/b") ]] ||
    { echo "manifests differ"; exit 1; }
done

python3 - "$WORK" <<'PY'
import statistics, sys
w = sys.argv[1]
med = {n: statistics.median(float(x) for x in open(f"{w}/{n}.times")) for n in
       ("fetch", "convert", "run", "budget")}
f = med["fetch"]
print(f"medians (s): fetch {f:.2f}, convert {med['convert']:.2f}, run {med['run']:.2f}, "
      f"run --disk-budget MIN {med['budget']:.2f}")
print(f"convert / fetch          {med['convert'] / f:.3f}  (the goals apply at >= 0.30)")
print(f"run / fetch              {med['run'] / f:.3f}  (goal <= 1.10)")
print(f"run --disk-budget / fetch {med['budget'] / f:.3f}  (goal <= 1.15)")
print(f"(fetch + convert) / fetch {(f + med['convert']) / f:.3f}  (the serial chain)")
try:
    base = statistics.median(float(x) for x in open(f"{w}/run-baseline.times"))
    print(f"baseline run / fetch     {base / f:.3f}  (this build's run / baseline's {med['run'] / base:.3f})")
except FileNotFoundError:
    pass
PY
