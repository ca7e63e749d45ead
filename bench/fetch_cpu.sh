#!/usr/bin/env bash
# The fetch's own CPU cost per byte (issue 39, item 1; run by hand, not in
# CI): ftpipe (this tree) against another ftpipe binary (a build of the
# commit before) and curl ×4 + sync, all from nginx on loopback, in
# interleaved rounds. On a machine shared with builds wall time is noise;
# CPU-seconds per GB (user + system of the client, /usr/bin/time) is what
# this measures. Medians over the rounds.
#
#   bench/fetch_cpu.sh --base BIN [--new BIN] [--size GIB] [--rounds N]
#                      [--cache DIR] [--work DIR] [--perf] [--ftpipe-args "ARGS"]
#
#   --base BIN     the ftpipe binary to compare against (required; e.g. a
#                  release build of main in another worktree and target dir).
#   --new BIN      the ftpipe binary under test (default: a release build of
#                  this tree in ${CARGO_TARGET_DIR:-target}).
#   --size GIB     repo size (default 1.5): four shards of GIB/4 random bytes
#                  plus eight small files (1 KiB .. 128 KiB).
#   --rounds N     interleaved rounds of (new, base, curl) (default 3).
#   --cache DIR    generated data, kept between runs
#                  (default ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/cpu).
#   --work DIR     where downloads go (default CACHE/work).
#   --perf         after the rounds, one more fetch of the new binary under
#                  `perf record -g`; prints the top symbols (self time).
#   --ftpipe-args "ARGS"  extra arguments for both ftpipe binaries.
#
# Needs: nginx, curl, /usr/bin/time, python3, openssl; perf for --perf.
# The source files are in the page cache (read before each run); each
# destination is deleted and `sync`ed before the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SIZE_GIB=1.5
ROUNDS=3
BASE=
NEW=
PERF=0
FTPIPE_ARGS=
CACHE=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/cpu
WORK=
while (($#)); do
  case $1 in
    --base) BASE=$2; shift 2 ;;
    --new) NEW=$2; shift 2 ;;
    --size) SIZE_GIB=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --perf) PERF=1; shift ;;
    --ftpipe-args) FTPIPE_ARGS=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n $BASE && -x $BASE ]] || { echo "--base BIN: an ftpipe binary to compare against" >&2; exit 2; }
WORK=${WORK:-$CACHE/work}
for t in nginx curl python3 openssl; do
  command -v "$t" >/dev/null || [[ -x /usr/sbin/$t ]] || { echo "missing: $t" >&2; exit 1; }
done
[[ -x /usr/bin/time ]] || { echo "missing: /usr/bin/time (apt-get install time)" >&2; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [[ -z $NEW ]]; then
  echo "== building the release binary (target dir ${CARGO_TARGET_DIR:-$ROOT/target})"
  cargo build --release --quiet -p ftpipe --bin ftpipe
  NEW=${CARGO_TARGET_DIR:-$ROOT/target}/release/ftpipe
fi

BYTES=$(python3 -c "print(int(float('$SIZE_GIB') * (1 << 30)))")
DATA=$CACHE/data-$BYTES
if [[ ! -f $DATA/ready ]]; then
  echo "== generating $BYTES bytes into $DATA (once)"
  rm -rf "$DATA"; mkdir -p "$DATA/repo"
  for i in 1 2 3 4; do
    openssl rand -out "$DATA/repo/model-0000$i-of-00004.safetensors" $((BYTES / 4))
  done
  for i in 0 1 2 3 4 5 6 7; do openssl rand -out "$DATA/repo/small-$i.bin" $((1024 << i)); done
  touch "$DATA/ready"
fi
mkdir -p "$WORK"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
NGX=$WORK/nginx
rm -rf "$NGX"; mkdir -p "$NGX"
python3 bench/static_hub.py "$NGX" "$PORT" "acme/cpu=cpu:$DATA/repo"
"$NGINX" -c "$NGX/nginx.conf" -p "$NGX" 2>"$NGX/nginx.stderr" &
NGINX_PID=$!
trap 'kill "$NGINX_PID" 2>/dev/null || true' EXIT
EP=http://127.0.0.1:$PORT
for _ in $(seq 100); do curl -sf -o /dev/null "$EP/api/models/acme/cpu/revision/main" && break; sleep 0.05; done
COMMIT=$(cat "$NGX/cpu.commit")
mapfile -t FILES < <(cut -f1 "$NGX/cpu.files")
TOTAL=$(awk -F'\t' '{s+=$2} END {printf "%.0f", s}' "$NGX/cpu.files")

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), sha_ni=$(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no)"
echo "== kernel $(uname -r); nginx $("$NGINX" -v 2>&1 | cut -d/ -f2); curl $(curl -V | head -1 | cut -d' ' -f2)"
echo "== repo acme/cpu: ${#FILES[@]} files, $TOTAL bytes; new $NEW; base $BASE"
t0=$(date +%s.%N)
dd if=/dev/zero of="$WORK/dd-test" bs=1M count=1024 conv=fsync status=none
echo "== disk: dd of 1 GiB with conv=fsync: $(python3 -c "import time; print(f'{(1<<30)/(time.time()-$t0)/1e6:.0f}')") MB/s"
rm -f "$WORK/dd-test"; sync

# run NAME CMD...: CMD timed (user, system, wall), then `sync` timed; one
# line per run appended to $WORK/runs.tsv.
: >"$WORK/runs.tsv"
run() {
  local name=$1 dest=$WORK/$1; shift
  rm -rf "$dest"; mkdir -p "$dest"; sync
  cat "$DATA"/repo/* >/dev/null
  local load; load=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/time -f '%U %S %e %M' -o "$WORK/$name.time" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || {
    echo "$name failed:"; tail -20 "$WORK/$name.err"; return 1; }
  local s0 s1; s0=$(date +%s.%N); sync; s1=$(date +%s.%N)
  read -r usr sys wall rss <"$WORK/$name.time"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$usr" "$sys" "$wall" "$(python3 -c "print(f'{$s1-$s0:.2f}')")" "$rss" >>"$WORK/runs.tsv"
  echo "   $name: user $usr s, sys $sys s, wall $wall s (+sync $(python3 -c "print(f'{$s1-$s0:.2f}')") s), peak RSS $((rss / 1024)) MiB, load $load"
}
check() {
  local dir=$1 f
  for f in "${FILES[@]}"; do cmp -s "$DATA/repo/$f" "$dir/$f" || { echo "   MISMATCH $dir/$f"; exit 1; }; done
}
ftpipe_run() {
  local name=$1 bin=$2
  # shellcheck disable=SC2086
  run "$name" "$bin" fetch acme/cpu --endpoint "$EP" --out "$WORK/$name" --quiet $FTPIPE_ARGS
  check "$WORK/$name/source"
  rm -rf "${WORK:?}/$name"
}
curl_args=()
for f in "${FILES[@]}"; do curl_args+=(-o "$WORK/curl/$f" "$EP/acme/cpu/resolve/$COMMIT/$f"); done
for ((r = 1; r <= ROUNDS; r++)); do
  echo "== round $r of $ROUNDS"
  ftpipe_run new "$NEW"
  ftpipe_run base "$BASE"
  run curl curl -sS --fail --create-dirs --parallel --parallel-max 4 "${curl_args[@]}"
  check "$WORK/curl"; rm -rf "$WORK/curl"
done

echo
echo "== CPU per GB (user + system of the client), medians of $ROUNDS interleaved rounds; $TOTAL bytes"
python3 - "$WORK/runs.tsv" "$TOTAL" <<'PY'
import statistics as st, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
gb = int(sys.argv[2]) / 1e9
print(f"{'client':<8} {'CPU s/GB':>9} {'user':>6} {'sys':>6}   {'wall':>7} {'+sync':>7}  {'RSS':>7}   rounds (CPU s/GB)")
for name in ("new", "base", "curl"):
    r = [(float(u), float(s), float(w), float(y)) for n, u, s, w, y, _ in rows if n == name]
    rss = max(int(m) for n, *_, m in rows if n == name) // 1024
    if not r:
        continue
    cpu = [(u + s) / gb for u, s, _, _ in r]
    print(f"{name:<8} {st.median(cpu):9.2f} {st.median(u for u, *_ in r) / gb:6.2f} "
          f"{st.median(s for _, s, *_ in r) / gb:6.2f}   {st.median(w for *_, w, _ in r):6.2f}s "
          f"{st.median(w + y for *_, w, y in r):6.2f}s  {rss:4d} MiB   {' '.join(f'{c:.2f}' for c in cpu)}")
PY

if ((PERF)); then
  command -v perf >/dev/null || { echo "missing: perf" >&2; exit 1; }
  echo
  echo "== perf record -g of one fetch by the new binary"
  rm -rf "$WORK/perf-out"; sync
  cat "$DATA"/repo/* >/dev/null
  # shellcheck disable=SC2086
  perf record -g -o "$WORK/perf.data" -- "$NEW" fetch acme/cpu --endpoint "$EP" --out "$WORK/perf-out" --quiet $FTPIPE_ARGS 2>"$WORK/perf.err"
  perf report -i "$WORK/perf.data" --no-children --sort symbol --stdio -g none --percent-limit 0.7 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
  rm -rf "$WORK/perf-out"
fi
