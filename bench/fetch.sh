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
#                   (default: the source files stay in the page cache, i.e. a
#                   server with the data in RAM; destinations are deleted
#                   between runs).
#   --skip TOOL     skip ftpipe|curl|aria2c|hf|resume (repeatable).
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
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
WORK=${WORK:-$CACHE/work}
skip() { [[ $SKIP == *" $1 "* ]]; }

for t in nginx curl aria2c python3 openssl; do
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

# -------------------------------------------- static hub API + nginx config
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
NGX=$WORK/nginx
rm -rf "$NGX"; mkdir -p "$NGX"
python3 - "$DATA" "$NGX" "$PORT" <<'PY'
import hashlib, json, os, sys
data, ngx, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
LFS = 64 * 1024

def digests(path):
    """(size, git blob sha1, sha256), cached next to the data by mtime and size."""
    st = os.stat(path)
    cache = os.path.join(data, "digests.json")
    try:
        c = json.load(open(cache))
    except Exception:
        c = {}
    key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    if key not in c:
        g = hashlib.sha1(b"blob %d\0" % st.st_size)
        s = hashlib.sha256()
        with open(path, "rb") as f:
            while b := f.read(1 << 20):
                g.update(b); s.update(b)
        c[key] = [st.st_size, g.hexdigest(), s.hexdigest()]
        json.dump(c, open(cache, "w"))
    return c[key]

locations = []
for repo, d in (("acme/tiny", "tiny"), ("acme/big", "big")):
    base = os.path.join(data, d)
    files = sorted(os.path.relpath(os.path.join(r, f), base)
                   for r, _, fs in os.walk(base) for f in fs)
    entries = []
    for p in files:
        size, git, sha = digests(os.path.join(base, p))
        e = {"type": "file", "path": p, "size": size}
        if size >= LFS or p.endswith(".safetensors"):
            ptr = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
            e["oid"] = hashlib.sha1(b"blob %d\0" % len(ptr) + ptr).hexdigest()
            e["lfs"] = {"oid": sha, "size": size, "pointerSize": len(ptr)}
        else:
            e["oid"] = git
        entries.append(e)
    commit = hashlib.sha1(json.dumps(entries, sort_keys=True).encode()).hexdigest()
    api = os.path.join(ngx, "www/api/models", repo)
    os.makedirs(os.path.join(api, "revision"), exist_ok=True)
    os.makedirs(os.path.join(api, "tree"), exist_ok=True)
    rev = {"id": repo, "modelId": repo, "sha": commit, "private": False,
           "siblings": [{"rfilename": p} for p in files]}
    for r in ("main", commit):
        json.dump(rev, open(os.path.join(api, "revision", r), "w"))
    json.dump(entries, open(os.path.join(api, "tree", commit), "w"))
    # The hub's resolve headers, per file (huggingface_hub needs X-Repo-Commit;
    # ftpipe cross-checks X-Linked-Etag / X-Linked-Size when present).
    for e in entries:
        p = e["path"]
        hdr = f'add_header X-Repo-Commit {commit} always;\n'
        if "lfs" in e:
            hdr += f'        add_header X-Linked-Etag \'"{e["lfs"]["oid"]}"\' always;\n'
            hdr += f'        add_header X-Linked-Size {e["size"]} always;\n'
        for rev_ in (commit, "main"):
            locations.append(
                f'    location = /{repo}/resolve/{rev_}/{p} {{\n'
                f'        alias {os.path.join(base, p)};\n        {hdr}    }}\n')
    open(os.path.join(ngx, d + ".commit"), "w").write(commit)
    open(os.path.join(ngx, d + ".files"), "w").write("\n".join(
        f'{e["path"]}\t{e["size"]}' for e in entries) + "\n")

conf = f"""daemon off;
master_process off;
worker_processes 1;
pid {ngx}/nginx.pid;
error_log {ngx}/error.log warn;
events {{ worker_connections 256; }}
http {{
    types {{ application/json json; }}
    default_type application/octet-stream;
    gzip off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 10000;
    client_body_temp_path {ngx}/client_body;
    proxy_temp_path {ngx}/proxy;
    fastcgi_temp_path {ngx}/fastcgi;
    uwsgi_temp_path {ngx}/uwsgi;
    scgi_temp_path {ngx}/scgi;
    log_format ranges escape=none '$status\\t$request_method\\t$uri\\trange=$http_range\\tif_range=$http_if_range\\tsent=$body_bytes_sent';
    access_log {ngx}/access.log ranges;
    server {{
        listen 127.0.0.1:{port};
        root {ngx}/www;
        location /api/ {{ default_type application/json; }}
{''.join(locations)}    }}
}}
"""
open(os.path.join(ngx, "nginx.conf"), "w").write(conf)
PY
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
cat "$DATA"/tiny/*.* "$DATA"/tiny/extra/* >/dev/null

# ---------------------------------------------------------------- helpers
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
SHANI=$(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no)
echo "== machine: $(nproc) cores, $CPU, sha_ni=$SHANI, $(free -g | awk '/Mem:/ {print $2}') GiB RAM"
echo "== kernel $(uname -r); nginx $("$NGINX" -v 2>&1 | cut -d/ -f2); curl $(curl -V | head -1 | cut -d' ' -f2); aria2c $(aria2c -v | head -1 | awk '{print $3}'); hf $(python3 -c 'import huggingface_hub as h; print(h.__version__)' 2>/dev/null || echo none)"
echo "== repo acme/tiny: $NFILES files, $TOTAL bytes; endpoint $EP (nginx, sendfile, no limit_rate)"
if ((DROP)); then echo "== page cache: dropped before each run"; else echo "== page cache: source warm (not dropped); destination deleted between runs"; fi

now() { date +%s.%N; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
drop() { if ((DROP)); then sync; echo 3 >/proc/sys/vm/drop_caches || echo "(cannot drop caches)"; fi; }

declare -A WALL WSYNC RSS
CURL_MBS=
# run NAME DEST CMD...: times CMD (and the sync after it), records peak RSS.
run() {
  local name=$1 dest=$2; shift 2
  rm -rf "$dest"; mkdir -p "$dest"; sync; drop
  echo "-- $name (load $(loadavg))"
  local t0 t1 t2
  t0=$(now)
  /usr/bin/time -v -o "$WORK/$name.time" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || {
    echo "$name failed:"; tail -20 "$WORK/$name.err"; tail -5 "$WORK/$name.out"; return 1; }
  t1=$(now); sync; t2=$(now)
  WALL[$name]=$(python3 -c "print(f'{$t1-$t0:.2f}')")
  WSYNC[$name]=$(python3 -c "print(f'{$t2-$t0:.2f}')")
  RSS[$name]=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2/1024}' "$WORK/$name.time")
}
# check DEST PREFIX: every file byte-identical to the source.
check() {
  local dest=$1 f bad=0
  for f in "${TINY_FILES[@]}"; do cmp -s "$DATA/tiny/$f" "$dest/$f" || { echo "   MISMATCH $f"; bad=1; }; done
  ((bad == 0)) && echo "   content check: $NFILES files identical" || return 1
}
report() {
  local name=$1
  [[ -n ${WALL[$name]:-} ]] || return 0
  python3 - "$name" "${WALL[$name]}" "${WSYNC[$name]}" "${RSS[$name]}" "$TOTAL" "${WALL[curl]:-}" "${WSYNC[curl]:-}" <<'PY'
import sys
n, w, ws, rss, total, cw, cws = sys.argv[1:]
w, ws, total = float(w), float(ws), int(total)
mb = total / w / 1e6; mbs = total / ws / 1e6
ratio = lambda a, b: f"{float(b)/a:5.2f}x" if b else "  n/a"
print(f"{n:<8} {w:8.2f} s {mb:9.0f} MB/s {ratio(w, cw):>7}   {ws:8.2f} s {mbs:9.0f} MB/s {ratio(ws, cws):>7}   {rss:>6} MiB")
PY
}

# ---------------------------------------------------------------- clients
if ! skip ftpipe; then
  run ftpipe "$WORK/ftpipe" "$FTPIPE" fetch acme/tiny --endpoint "$EP" --out "$WORK/ftpipe" --quiet
  check "$WORK/ftpipe/source"
  "$FTPIPE" audit --out "$WORK/ftpipe" --json | python3 -c 'import json,sys; a=json.load(sys.stdin); print("   audit ok:", a["ok"], "reconciliation_error:", a["reconciliation_error"])'
fi
if ! skip curl; then
  args=()
  for f in "${TINY_FILES[@]}"; do args+=(-o "$WORK/curl/$f" "$EP/acme/tiny/resolve/$TINY_COMMIT/$f"); done
  # 4 transfers at a time (ftpipe's default --jobs 4), one process, no hashing.
  run curl "$WORK/curl" curl -sS --fail --create-dirs --parallel --parallel-max 4 "${args[@]}"
  check "$WORK/curl"
fi
if ! skip aria2c; then
  : >"$WORK/aria2.list"
  for f in "${TINY_FILES[@]}"; do printf '%s\n  out=%s\n' "$EP/acme/tiny/resolve/$TINY_COMMIT/$f" "$f" >>"$WORK/aria2.list"; done
  # 4 files at a time, each split over up to 4 connections; no checksum.
  run aria2c "$WORK/aria2c" aria2c -q -x4 -s4 -j4 --min-split-size=64M --file-allocation=falloc \
    --allow-overwrite=true --auto-file-renaming=false -d "$WORK/aria2c" -i "$WORK/aria2.list"
  check "$WORK/aria2c"
fi
if ! skip hf && command -v hf >/dev/null; then
  export HF_HOME=$WORK/hf-home HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_DISABLE_XET=1
  rm -rf "$HF_HOME"
  # huggingface_hub's snapshot download (8 files at a time by default), against nginx.
  run hf "$WORK/hf" env HF_ENDPOINT="$EP" hf download acme/tiny --revision "$TINY_COMMIT" --local-dir "$WORK/hf"
  check "$WORK/hf"
fi

echo
echo "== acme/tiny, $TOTAL bytes in $NFILES files (ratio = throughput / curl's)"
echo "client        wall   throughput   ratio       +sync   throughput   ratio    peak RSS"
for n in ftpipe curl aria2c hf; do report "$n"; done
for n in ftpipe curl aria2c hf; do rm -rf "${WORK:?}/$n"; done

# ---------------------------------------------------------------- resume
if ! skip resume; then
  BIG_SIZE=$(stat -c %s "$DATA/big/big.bin")
  OUT=$WORK/resume
  rm -rf "$OUT"; sync
  cat "$DATA/big/big.bin" >/dev/null
  echo
  echo "== resume: acme/big, one $BIG_SIZE-byte file, kill -9 at half, default checkpoints (64 MiB / 2 s) (load $(loadavg))"
  "$FTPIPE" fetch acme/big --endpoint "$EP" --out "$OUT" --quiet >/dev/null 2>&1 &
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
  /usr/bin/time -v -o "$WORK/resume.time" "$FTPIPE" fetch acme/big --endpoint "$EP" --out "$OUT" --json 2>"$WORK/resume.err" |
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
    a=$(now); head -c "$RW" "$OUT/source/big.bin" | $tool >/dev/null; b=$(now)
    python3 -c "print(f'   prefix {$RW} bytes | $tool: {$b-$a:.3f} s = {$RW/($b-$a)/1e9:.2f} GB/s')"
  done
  python3 - "$(openssl speed -seconds 2 -bytes 1048576 -evp sha256 2>/dev/null | tail -1)" <<'PY'
import sys
f = sys.argv[1].split()
print(f"   openssl speed -evp sha256 (1 MiB blocks, in memory, no I/O): {float(f[-1].rstrip('k')) * 1000 / 1e9:.2f} GB/s")
PY
  echo "   (prefix was written just before: page cache warm for ftpipe's re-hash and for the baselines)"
  cmp -s "$DATA/big/big.bin" "$OUT/source/big.bin" && echo "   content check: identical"
  rm -rf "$OUT"
fi
echo "== done (load $(loadavg))"
