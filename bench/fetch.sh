#!/usr/bin/env bash
# Fetch benchmark (run by hand, not in CI): ftpipe vs curl, aria2c and
# `hf download`, all against nginx on loopback serving the same files, plus the
# cost of a resume after kill -9 halfway through a big file.
#
#   bench/fetch.sh [--size GIB] [--cache DIR] [--drop-caches] [--skip TOOL]...
#
#   --size GIB      repo size in GiB (default 4): 4 ~GIB/4 safetensors shards +
#                   small files; the resume file is their concatenation (~GIB).
#   --cache DIR     where generated data is kept between runs
#                   (default ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}).
#   --work DIR      where downloads go (default CACHE/work; same volume).
#   --drop-caches   echo 3 > /proc/sys/vm/drop_caches before each timed run
#                   (default: the source files are read into the page cache
#                   before each run, i.e. a server with the data in RAM;
#                   destinations are deleted between runs).
#   --skip TOOL     skip ftpipe|curl|aria2c|hf|resume|capped (repeatable).
#   --rounds N      interleaved rounds per client (default 2); medians printed.
#   --ftpipe-args "ARGS"  extra arguments for ftpipe's capped-link fetches.
#   --cap MBPS      per-connection cap of the capped-link part (default 20 MB/s,
#                   nginx limit_rate), serving one 1.5 GiB shard, three 300 MiB
#                   shards and small files.
#   --baseline BIN  another ftpipe binary (e.g. a build of the previous
#                   commit), run right after ftpipe in every round as client
#                   "ftpipe-base" / "c-ftpipe-base": a before/after ratio
#                   measured in the same invocation.
#
# Needs: nginx, curl, aria2c, /usr/bin/time, python3, openssl, and `hf`
# (pip install huggingface_hub). Debian: apt-get install nginx-light aria2 time
#
# Every client is timed twice: "wall" is the client's own wall time; "+sync" adds
# the `sync` right after it, i.e. until the bytes are on disk. ftpipe fsyncs its
# checkpoints and publishes durably, so "+sync" is the like-for-like column.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SIZE_GIB=4
ROUNDS=2
CAP_MBPS=20
FTPIPE_ARGS=
BASELINE=
CACHE=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}
WORK=
DROP=0
SKIP=" "
while (($#)); do
  case $1 in
    --size) SIZE_GIB=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --drop-caches) DROP=1; shift ;;
    --skip) SKIP+="$2 "; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --cap) CAP_MBPS=$2; shift 2 ;;
    --ftpipe-args) FTPIPE_ARGS=$2; shift 2 ;;
    --baseline) BASELINE=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
WORK=${WORK:-$CACHE/work}
skip() { [[ $SKIP == *" $1 "* ]]; }

for t in nginx curl aria2c python3 openssl; do
  [[ $t == aria2c ]] && skip aria2c && continue
  command -v "$t" >/dev/null || [[ -x /usr/sbin/$t ]] || { echo "missing: $t" >&2; exit 1; }
done
[[ -x /usr/bin/time ]] || { echo "missing: /usr/bin/time (apt-get install time)" >&2; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
echo "== building release binaries (target dir $TARGET)"
cargo build --release --quiet -p ftpipe --bin ftpipe
cargo build --release --quiet -p ftpipe-fixtures --bin fixture-hub
FTPIPE=$TARGET/release/ftpipe
FIXHUB=$TARGET/release/fixture-hub

BYTES=$(python3 -c "print(int(float('$SIZE_GIB') * (1 << 30)))")
DATA=$CACHE/data-$BYTES
mkdir -p "$DATA" "$WORK"

# ---------------------------------------------------------------- data, once
if [[ ! -f $DATA/ready ]]; then
  echo "== generating ~$SIZE_GIB GiB into $DATA (once)"
  rm -rf "$DATA/tiny" "$DATA/big"
  mkdir -p "$DATA/tiny" "$DATA/big"
  # The fixture generator writes the repo and then serves it: stop it once it
  # prints ENDPOINT (the files are complete by then).
  "$FIXHUB" --repo acme/tiny --dir "$DATA/tiny" --generate-bytes "$BYTES" --seed 7 \
    >"$DATA/gen.out" 2>/dev/null &
  GEN_PID=$!
  until grep -q '^ENDPOINT=' "$DATA/gen.out"; do
    kill -0 "$GEN_PID" 2>/dev/null || { echo "generator failed" >&2; exit 1; }
    sleep 0.2
  done
  kill "$GEN_PID"; wait "$GEN_PID" 2>/dev/null || true
  # Some more small files (real, incompressible content).
  mkdir -p "$DATA/tiny/extra"
  for i in 0 1 2 3 4 5 6 7 8 9 10 11; do
    openssl rand -out "$DATA/tiny/extra/small-$i.bin" $((1024 << i)) # 1 KiB .. 2 MiB
  done
  # The resume subject: one ~SIZE GiB file, the shards concatenated.
  cat "$DATA"/tiny/model-*.safetensors >"$DATA/big/big.bin"
  touch "$DATA/ready"
fi
# The capped-link repo: one 1.5 GiB shard, three 300 MiB shards, small files.
CAPPED=$CACHE/capped
if [[ ! -f $CAPPED/ready ]] && ! skip capped; then
  echo "== generating the capped-link repo into $CAPPED (once)"
  rm -rf "$CAPPED"; mkdir -p "$CAPPED"
  openssl rand -out "$CAPPED/model-00001-of-00004.safetensors" $((1536 << 20))
  for i in 2 3 4; do openssl rand -out "$CAPPED/model-0000$i-of-00004.safetensors" $((300 << 20)); done
  for i in 0 1 2 3 4 5; do openssl rand -out "$CAPPED/small-$i.json" $((4096 << i)); done
  touch "$CAPPED/ready"
fi

# -------------------------------------------- static hub API + nginx config
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
NGX=$WORK/nginx
rm -rf "$NGX"; mkdir -p "$NGX"
REPOS=("acme/tiny=tiny:$DATA/tiny" "acme/big=big:$DATA/big")
[[ -f $CAPPED/ready ]] && REPOS+=("acme/capped=capped:$CAPPED:$CAP_MBPS")
python3 bench/static_hub.py "$NGX" "$PORT" "${REPOS[@]}"
"$NGINX" -c "$NGX/nginx.conf" -p "$NGX" 2>"$NGX/nginx.stderr" &
NGINX_PID=$!
cleanup() { kill "$NGINX_PID" 2>/dev/null || true; }
trap cleanup EXIT
EP=http://127.0.0.1:$PORT
for _ in $(seq 100); do curl -sf -o /dev/null "$EP/api/models/acme/tiny/revision/main" && break; sleep 0.05; done
curl -sf -o /dev/null "$EP/api/models/acme/tiny/revision/main" || { cat "$NGX/nginx.stderr" "$NGX/error.log"; exit 1; }
TINY_COMMIT=$(cat "$NGX/tiny.commit")
mapfile -t TINY_FILES < <(cut -f1 "$NGX/tiny.files")
TOTAL=$(awk -F'\t' '{s+=$2} END {printf "%.0f", s}' "$NGX/tiny.files")
NFILES=${#TINY_FILES[@]}

# Warm the source in the page cache (the server has the data in RAM).
WARM=("$DATA"/tiny/*.* "$DATA"/tiny/extra/*)
cat "${WARM[@]}" >/dev/null

# ---------------------------------------------------------------- helpers
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
SHANI=$(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no)
echo "== machine: $(nproc) cores, $CPU, sha_ni=$SHANI, $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
echo "== kernel $(uname -r); nginx $("$NGINX" -v 2>&1 | cut -d/ -f2); curl $(curl -V | head -1 | cut -d' ' -f2); aria2c $(skip aria2c && echo skipped || aria2c -v | head -1 | awk '{print $3}'); hf $(python3 -c 'import huggingface_hub as h; print(h.__version__)' 2>/dev/null || echo none)"
echo "== repo acme/tiny: $NFILES files, $TOTAL bytes; endpoint $EP (nginx, sendfile, no limit_rate)"
if ((DROP)); then echo "== page cache: dropped before each run"; else echo "== page cache: source warm (not dropped); destination deleted between runs"; fi

now() { date +%s.%N; }
# Pages scanned for reclaim so far: "kswapd direct" (direct reclaim is
# system time charged to the client that allocates).
reclaimed() { awk '/^pgscan_kswapd /{k=$2} /^pgscan_direct /{d=$2} END {print k, d}' /proc/vmstat; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
drop() { if ((DROP)); then sync; echo 3 >/proc/sys/vm/drop_caches || echo "(cannot drop caches)"; fi; }

# Per client, one value per round: wall, wall+sync, peak RSS, user/system CPU.
declare -A WALL WSYNC RSS USR SYS
# run NAME DEST CMD...: times CMD (and the sync after it), records peak RSS
# and CPU seconds; appends to the client's round lists.
# WARM: the source files read into the page cache before each run (the
# kernel drops some of them between runs even with memory free, and a
# sendfile that waits for the disk stalls its connection).
WARM=()
run() {
  local name=$1 dest=$2; shift 2
  rm -rf "$dest"; mkdir -p "$dest"; sync; drop
  if ((!DROP && ${#WARM[@]})); then cat "${WARM[@]}" >/dev/null; fi
  echo "-- $name (load $(loadavg))"
  local t0 t1 t2 r0 r1
  : >"$NGX/access.log"
  r0=$(reclaimed)
  t0=$(now)
  /usr/bin/time -v -o "$WORK/$name.time" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || {
    echo "$name failed:"; tail -20 "$WORK/$name.err"; tail -5 "$WORK/$name.out"; return 1; }
  t1=$(now); sync; t2=$(now)
  r1=$(reclaimed)
  echo "   $(python3 -c "print(f'{$t2-$t0:.2f}')") s +sync; page reclaim during the run (pages scanned by kswapd / direct): $(python3 -c "a='$r0'.split(); b='$r1'.split(); print(int(b[0])-int(a[0]), '/', int(b[1])-int(a[1]))")"
  served "$NGX/access.log"
  WALL[$name]+="$(python3 -c "print(f'{$t1-$t0:.2f}')") "
  WSYNC[$name]+="$(python3 -c "print(f'{$t2-$t0:.2f}')") "
  RSS[$name]+="$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$WORK/$name.time") "
  USR[$name]+="$(awk -F': ' '/User time/ {print $2}' "$WORK/$name.time") "
  SYS[$name]+="$(awk -F': ' '/System time/ {print $2}' "$WORK/$name.time") "
}
# served LOG: what nginx delivered during the run, from its log (file
# bodies only): the rate of a busy connection (bytes / request time), the
# requests, and (capped runs) the connection-seconds of SERVED_CONNS left
# idle between the first request and the last byte. Tells a slow server
# from a client's scheduling.
served() {
  python3 - "$1" "$SERVED_CONNS" <<'PY'
import sys
rows = []
for l in open(sys.argv[1]):
    f = l.rstrip("\n").split("\t")
    if len(f) < 4 or "/resolve/" not in f[2]:
        continue
    d = dict(x.split("=", 1) for x in f[3:] if "=" in x)
    end, dur, sent = float(d["end"]), float(d["dur"]), int(d["sent"])
    rows.append((end - dur, end, sent))
if rows:
    t0, t1 = min(r[0] for r in rows), max(r[1] for r in rows)
    busy = sum(r[1] - r[0] for r in rows) or 1e-9
    line = (f"   nginx: {sum(r[2] for r in rows) / busy / 1e6:.2f} MB/s per busy connection, "
            f"{len(rows)} requests over {t1 - t0:.2f} s")
    if int(sys.argv[2]):
        line += f", {int(sys.argv[2]) * (t1 - t0) - busy:.2f} of {sys.argv[2]} connections' seconds idle"
    print(line)
PY
}
# Connections a client is meant to keep busy (0: not reported).
SERVED_CONNS=0
# check SRC DEST FILE...: every file byte-identical to the source.
check() {
  local src=$1 dest=$2 f bad=0; shift 2
  for f in "$@"; do cmp -s "$src/$f" "$dest/$f" || { echo "   MISMATCH $f"; bad=1; }; done
  ((bad == 0)) && echo "   content check: $# files identical" || return 1
}
# table TOTAL BASE CLIENT...: medians over the rounds; ratios against BASE.
table() {
  local total=$1 base=$2; shift 2
  echo "client    rounds   wall (median)    +sync (median)   ratio(+sync)   peak RSS   CPU user / sys per GB"
  for n in "$@"; do
    [[ -n ${WALL[$n]:-} ]] || continue
    python3 - "$n" "$total" "${WALL[$n]}" "${WSYNC[$n]}" "${RSS[$n]}" "${USR[$n]}" "${SYS[$n]}" "${WSYNC[$base]:-}" <<'PY'
import statistics as st, sys
n, total = sys.argv[1], int(sys.argv[2])
w, ws, rss, usr, sy, base = ([float(x) for x in a.split()] for a in sys.argv[3:9])
med = st.median
gb = total / 1e9
ratio = f"{med(ws) / med(base):5.2f}x" if base else "  n/a"
print(f"{n:<9} {len(w):>3}   {med(w):7.2f} s {total/med(w)/1e6:5.0f} MB/s  {med(ws):7.2f} s {total/med(ws)/1e6:5.0f} MB/s   {ratio:>8}   {max(rss):5.0f} MiB   {med(usr)/gb:5.2f} s / {med(sy)/gb:5.2f} s"
      f"   (all +sync: {' '.join(f'{x:.2f}' for x in ws)})")
PY
  done
}

# ------------------------------------------------- destination warm-up
# On this kind of machine (a VM) the first few GB written after a while
# cost several times the system time of later ones (dd of 4 GiB with
# fdatasync here: 11.8 s and 10.9 s of system time, then 2.96 s and 2.3 s
# right after), and whichever client ran first in the first round paid it.
# Two untimed writes of the repo's size, printed, before any timed run.
for i in 1 2; do
  t0=$(now)
  dd if=/dev/zero of="$WORK/warm-up" bs=4M count=$(((TOTAL >> 22) + 1)) conv=fdatasync status=none
  rm -f "$WORK/warm-up"; sync
  echo "== destination warm-up $i: $(python3 -c "print(f'{$(now)-$t0:.2f}')") s to write and fsync $TOTAL bytes"
done

# ---------------------------------------------------------------- loopback clients
TINY_DEST=()
for ((round = 1; round <= ROUNDS; round++)); do
  echo "== loopback round $round of $ROUNDS"
  if ! skip ftpipe; then
    run ftpipe "$WORK/ftpipe" "$FTPIPE" fetch acme/tiny --endpoint "$EP" --out "$WORK/ftpipe" --quiet
    check "$DATA/tiny" "$WORK/ftpipe/source" "${TINY_FILES[@]}"
    "$FTPIPE" audit --out "$WORK/ftpipe" --json | python3 -c 'import json,sys; a=json.load(sys.stdin); print("   audit ok:", a["ok"], "reconciliation_error:", a["reconciliation_error"])'
    rm -rf "$WORK/ftpipe"
    if [[ -n $BASELINE ]]; then
      run ftpipe-base "$WORK/ftpipe-base" "$BASELINE" fetch acme/tiny --endpoint "$EP" --out "$WORK/ftpipe-base" --quiet
      check "$DATA/tiny" "$WORK/ftpipe-base/source" "${TINY_FILES[@]}"
      rm -rf "$WORK/ftpipe-base"
    fi
  fi
  if ! skip curl; then
    args=()
    for f in "${TINY_FILES[@]}"; do args+=(-o "$WORK/curl/$f" "$EP/acme/tiny/resolve/$TINY_COMMIT/$f"); done
    # 4 transfers at a time, one process, no hashing.
    run curl "$WORK/curl" curl -sS --fail --create-dirs --parallel --parallel-max 4 "${args[@]}"
    check "$DATA/tiny" "$WORK/curl" "${TINY_FILES[@]}"
    rm -rf "$WORK/curl"
  fi
  if ! skip aria2c; then
    : >"$WORK/aria2.list"
    for f in "${TINY_FILES[@]}"; do printf '%s\n  out=%s\n' "$EP/acme/tiny/resolve/$TINY_COMMIT/$f" "$f" >>"$WORK/aria2.list"; done
    # 4 files at a time, each split over up to 4 connections; no checksum.
    run aria2c "$WORK/aria2c" aria2c -q -x4 -s4 -j4 --min-split-size=64M --file-allocation=falloc \
      --allow-overwrite=true --auto-file-renaming=false -d "$WORK/aria2c" -i "$WORK/aria2.list"
    check "$DATA/tiny" "$WORK/aria2c" "${TINY_FILES[@]}"
    rm -rf "$WORK/aria2c"
  fi
  if ! skip hf && command -v hf >/dev/null; then
    export HF_HOME=$WORK/hf-home HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_XET=1
    rm -rf "$HF_HOME"
    run hf "$WORK/hf" env HF_ENDPOINT="$EP" hf download acme/tiny --revision "$TINY_COMMIT" --local-dir "$WORK/hf"
    check "$DATA/tiny" "$WORK/hf" "${TINY_FILES[@]}"
    rm -rf "$WORK/hf" "$HF_HOME"
  fi
done
echo
echo "== loopback (CPU-bound): acme/tiny, $TOTAL bytes in $NFILES files; ratio = +sync time / curl's"
table "$TOTAL" curl ftpipe ftpipe-base curl aria2c hf
for n in ftpipe ftpipe-base curl aria2c hf; do rm -rf "${WORK:?}/$n"; done

# ---------------------------------------------------------------- capped links
if ! skip capped; then
  CAPPED_COMMIT=$(cat "$NGX/capped.commit")
  mapfile -t CAPPED_FILES < <(cut -f1 "$NGX/capped.files")
  CTOTAL=$(awk -F'\t' '{s+=$2} END {printf "%.0f", s}' "$NGX/capped.files")
  WARM=("$CAPPED"/*)
  cat "${WARM[@]}" >/dev/null
  SERVED_CONNS=8
  for k in ftpipe ftpipe-base aria2c hf curl8; do unset "WALL[c-$k]" "WSYNC[c-$k]" "RSS[c-$k]" "USR[c-$k]" "SYS[c-$k]"; done
  # What this server delivers to 8 perfectly balanced connections: the
  # files' bytes cut into 8 equal spans planned in advance, each fetched by
  # one curl after another (range requests, bodies to /dev/null). The
  # like-for-like "ideal" on this machine, beside the nominal one.
  python3 - "$NGX/capped.files" "$EP/acme/capped/resolve/$CAPPED_COMMIT" >"$WORK/c-curl8.sh" <<'PY'
import sys
files = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
files = [(p, int(n)) for p, n, *_ in files]
total = sum(n for _, n in files)
share = -(-total // 8)
spans, at = [[] for _ in range(8)], 0
for p, n in files:
    off = 0
    while off < n:
        k = at // share
        take = min(n - off, (k + 1) * share - at)
        spans[k].append(f"curl -sf -o /dev/null -r {off}-{off + take - 1} '{sys.argv[2]}/{p}'")
        off, at = off + take, at + take
print("set -e")
for cmds in spans:
    print("( " + " && ".join(cmds) + " ) &")
print("wait")
PY
  for ((round = 1; round <= ROUNDS; round++)); do
    echo "== capped round $round of $ROUNDS: nginx limit_rate $CAP_MBPS MB/s per connection"
    if ! skip ftpipe; then
      # shellcheck disable=SC2086
      run c-ftpipe "$WORK/c-ftpipe" "$FTPIPE" fetch acme/capped --endpoint "$EP" --out "$WORK/c-ftpipe" --quiet --connections 8 $FTPIPE_ARGS
      check "$CAPPED" "$WORK/c-ftpipe/source" "${CAPPED_FILES[@]}"
      rm -rf "$WORK/c-ftpipe"
      if [[ -n $BASELINE ]]; then
        # shellcheck disable=SC2086
        run c-ftpipe-base "$WORK/c-ftpipe-base" "$BASELINE" fetch acme/capped --endpoint "$EP" --out "$WORK/c-ftpipe-base" --quiet --connections 8 $FTPIPE_ARGS
        check "$CAPPED" "$WORK/c-ftpipe-base/source" "${CAPPED_FILES[@]}"
        rm -rf "$WORK/c-ftpipe-base"
      fi
    fi
    if ! skip curl; then
      run c-curl8 "$WORK/c-curl8" bash "$WORK/c-curl8.sh"
    fi
    if ! skip aria2c; then
      : >"$WORK/c-aria2.list"
      for f in "${CAPPED_FILES[@]}"; do printf '%s\n  out=%s\n' "$EP/acme/capped/resolve/$CAPPED_COMMIT/$f" "$f" >>"$WORK/c-aria2.list"; done
      # The same connection budget: 8 connections, one file at a time.
      run c-aria2c "$WORK/c-aria2c" aria2c -q -j1 -x8 -s8 --min-split-size=16M --file-allocation=falloc \
        --allow-overwrite=true --auto-file-renaming=false -d "$WORK/c-aria2c" -i "$WORK/c-aria2.list"
      check "$CAPPED" "$WORK/c-aria2c" "${CAPPED_FILES[@]}"
      rm -rf "$WORK/c-aria2c"
    fi
    if ! skip hf && command -v hf >/dev/null; then
      export HF_HOME=$WORK/hf-home HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_XET=1
      rm -rf "$HF_HOME"
      run c-hf "$WORK/c-hf" env HF_ENDPOINT="$EP" hf download acme/capped --revision "$CAPPED_COMMIT" --local-dir "$WORK/c-hf"
      check "$CAPPED" "$WORK/c-hf" "${CAPPED_FILES[@]}"
      rm -rf "$WORK/c-hf"
    fi
  done
  IDEAL=$(python3 -c "print(f'{$CTOTAL / (8 * $CAP_MBPS * 1e6):.2f}')")
  echo
  echo "== capped links: acme/capped, $CTOTAL bytes in ${#CAPPED_FILES[@]} files, $CAP_MBPS MB/s per connection;"
  echo "   ideal for 8 connections = bytes / (8 x cap) = $IDEAL s; ratio = +sync time / ftpipe's"
  table "$CTOTAL" c-ftpipe c-ftpipe c-ftpipe-base c-curl8 c-aria2c c-hf
  python3 -c "import statistics as s; w=[float(x) for x in '${WSYNC[c-ftpipe]:-0}'.split()]; print(f'   ftpipe median +sync / ideal = {s.median(w)/$IDEAL:.3f}')"
  if [[ -n ${WSYNC[c-curl8]:-} ]]; then
    python3 -c "import statistics as s; f=s.median([float(x) for x in '${WSYNC[c-ftpipe]}'.split()]); c=s.median([float(x) for x in '${WSYNC[c-curl8]}'.split()]); print(f'   curl x8 balanced (what the server delivers): {c:.2f} s = {c/$IDEAL:.3f} x ideal; ftpipe / curl x8 = {f/c:.3f}')"
  fi
  for n in c-ftpipe c-ftpipe-base c-aria2c c-hf; do rm -rf "${WORK:?}/$n"; done

  # Resume of a killed segmented download.
  if ! skip resume; then
    OUT=$WORK/c-resume
    rm -rf "$OUT"; : >"$NGX/access.log"
    "$FTPIPE" fetch acme/capped --endpoint "$EP" --out "$OUT" --quiet --connections 8 &
    FP=$!
    sleep "$(python3 -c "print($IDEAL / 2)")"
    kill -9 "$FP"; wait "$FP" 2>/dev/null || true
    INFLIGHT=$(python3 -c "import sqlite3; c=sqlite3.connect('file:$OUT/.ftpipe/state.db?mode=ro', uri=True); print(c.execute(\"select count(*) from attempts where outcome='in_flight'\").fetchone()[0], c.execute('select count(*) from fetch_ranges').fetchone()[0], c.execute('select sum(committed_bytes) from ledger').fetchone()[0])")
    echo
    echo "== capped resume: killed at $(python3 -c "print($IDEAL / 2)") s with (in-flight attempts, ranges, durable bytes) = $INFLIGHT"
    t0=$(now)
    "$FTPIPE" fetch acme/capped --endpoint "$EP" --out "$OUT" --quiet --connections 8
    t1=$(now)
    check "$CAPPED" "$OUT/source" "${CAPPED_FILES[@]}"
    python3 - "$OUT/.ftpipe/state.db" "$NGX/access.log" "$CTOTAL" "$t0" "$t1" <<'PY'
import sqlite3, sys
db, log, total, t0, t1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
transferred = c.execute("select sum(transferred_bytes) from ledger").fetchone()[0]
disc = c.execute("select reason, count(*), sum(bytes) from discards group by reason").fetchall()
sent = sum(int(l.rsplit("sent=", 1)[1]) for l in open(log) if "/acme/capped/resolve/" in l and "sent=" in l)
print(f"   resume wall {t1 - t0:.2f} s; ledger: transferred {transferred} = size {total} + discards {transferred - total}")
print(f"   discards by reason: {disc}")
print(f"   nginx sent {sent} body bytes over both runs: {sent - total} more than the repo "
      f"(incl. bytes in socket buffers at the kill that never reached ftpipe)")
PY
    rm -rf "$OUT"
  fi
fi

# ---------------------------------------------------------------- resume
if ! skip resume; then
  BIG_SIZE=$(stat -c %s "$DATA/big/big.bin")
  OUT=$WORK/resume
  rm -rf "$OUT"; sync
  cat "$DATA/big/big.bin" >/dev/null
  echo
  echo "== resume: acme/big, one $BIG_SIZE-byte file as one stream (--connections 1), kill -9 at half, default checkpoints (1/256 of the file within 4-64 MiB, or 2 s) (load $(loadavg))"
  "$FTPIPE" fetch acme/big --endpoint "$EP" --out "$OUT" --quiet --connections 1 >/dev/null 2>&1 &
  FP=$!
  PART=$OUT/source/big.bin.part
  while :; do
    s=$(stat -c %s "$PART" 2>/dev/null || echo 0)
    ((s >= BIG_SIZE / 2)) && break
    kill -0 "$FP" 2>/dev/null || { echo "ftpipe ended before the kill"; exit 1; }
    sleep 0.005
  done
  kill -9 "$FP"; wait "$FP" 2>/dev/null || true
  PART_LEN=$(stat -c %s "$PART")
  W=$(python3 -c "import sqlite3,sys; c=sqlite3.connect('file:$OUT/.ftpipe/state.db?mode=ro', uri=True); print(c.execute(\"select committed_bytes from ledger where path='big.bin'\").fetchone()[0])")
  echo "   killed with .part at $PART_LEN bytes; durable watermark $W"
  sync; drop
  # Timestamp the resume's events (not the per-chunk ones) as they are printed.
  t0=$(now)
  /usr/bin/time -v -o "$WORK/resume.time" "$FTPIPE" fetch acme/big --endpoint "$EP" --out "$OUT" --json --connections 1 2>"$WORK/resume.err" |
    python3 -c '
import sys, time
t0 = float(sys.argv[1]); out = open(sys.argv[2], "w")
for line in sys.stdin:
    if "\"file_bytes\"" not in line:
        out.write(f"{time.time() - t0:.4f} {line}")
' "$t0" "$WORK/resume.events"
  t1=$(now); sync; t2=$(now)
  python3 - "$WORK/resume.events" "$W" "$BIG_SIZE" "$t0" "$t1" "$t2" "$WORK/resume.time" <<'PY'
import json, sys
ev_path, W, size, t0, t1, t2, tfile = sys.argv[1:]
W, size, t0, t1, t2 = int(W), int(size), float(t0), float(t1), float(t2)
evs = []
for line in open(ev_path):
    t, j = line.split(" ", 1)
    evs.append((float(t), json.loads(j)))
start = next(t for t, e in evs if e["event"] == "file_started")
before = [t for t, e in evs if e["event"] in ("fetch_planned", "file_rewound") and t <= start]
rehash = start - max(before)
resumed = next(e["resumed_from"] for t, e in evs if e["event"] == "file_started")
rss = [l for l in open(tfile) if "Maximum resident" in l][0].split(":")[1].strip()
print(f"   resumed_from {resumed} (watermark {W}); events: " + ", ".join(f'{e["event"]}@{t:.2f}s' for t, e in evs))
print(f"   resume wall {t1-t0:.2f} s (+sync {t2-t0:.2f} s) for {size-resumed} new bytes, peak RSS {int(rss)//1024} MiB")
print(f"   prefix re-hash: {resumed} bytes in {rehash:.3f} s = {resumed/rehash/1e9:.2f} GB/s (ftpipe, time to file_started)")
open(ev_path + ".w", "w").write(str(resumed))
PY
  RW=$(cat "$WORK/resume.events.w")
  for tool in "sha256sum" "openssl dgst -sha256"; do
    # Out of the page cache first, as the prefix was for ftpipe.
    dd if="$OUT/source/big.bin" iflag=nocache count=0 status=none
    a=$(now); head -c "$RW" "$OUT/source/big.bin" | $tool >/dev/null; b=$(now)
    python3 -c "print(f'   prefix {$RW} bytes | $tool: {$b-$a:.3f} s = {$RW/($b-$a)/1e9:.2f} GB/s')"
  done
  python3 - "$(openssl speed -seconds 2 -bytes 1048576 -evp sha256 2>/dev/null | tail -1)" <<'PY'
import sys
f = sys.argv[1].split()
print(f"   openssl speed -evp sha256 (1 MiB blocks, in memory, no I/O): {float(f[-1].rstrip('k')) * 1000 / 1e9:.2f} GB/s")
PY
  echo "   (prefix not in the page cache: ftpipe wrote it past the cache, and dropped it from the cache for each baseline with dd iflag=nocache)"
  cmp -s "$DATA/big/big.bin" "$OUT/source/big.bin" && echo "   content check: identical"
  rm -rf "$OUT"
fi
echo "== done (load $(loadavg))"
