#!/usr/bin/env bash
# Xet benchmark (run by hand, not in CI; issue 37's goals): ftpipe against
# `hf download` (huggingface_hub with hf_xet), both fetching from one Xet CAS
# on loopback (Hugging Face's `local_cas_server`, filled by the reference
# uploader hf_xet through fixtures/scripts/xet_upload.py) behind the fixture
# hub (`fixture-hub --xet-cas --xet-hashes`: resolve answers carry
# `X-Xet-Hash`, the read-token route names the CAS). One invocation prints:
#   1. fresh fetch of the big file (a qwen4_exp repo whose PLE table alone
#      fills model-00002-of-00002.safetensors, `fixture-hub --big-ple-bytes`):
#      `ftpipe fetch` vs `hf download`, each followed by `sync`, interleaved
#      rounds, medians and their ratio;
#   2. each tool kill -9ed when the CAS has sent it 90 % of what it sent
#      the tool's fresh fetch in part 1, then run again: the bytes fetched
#      again, as % of the file;
#   3. a revision that changes K expert weights of one shard of a second
#      repo (the demo's Qwen4-Exp NVFP4 export in the released layout,
#      `fixture-hub --release-demo`: real-sized rows, a shard of ~78 MB per
#      4 layers), uploaded with hf_xet (which stores only the new chunks):
#      `ftpipe run --repin` of the converted first revision, the CAS bytes it fetched
#      against the new chunks' bytes hf_xet uploaded, the audit's Xet line,
#      the components converted again against those reading a changed
#      tensor, and its manifest against a fresh build of the new revision;
#      `hf download` of the new revision into its warm cache alongside.
#
#   bench/xet.sh [--size-mb N] [--tensors K] [--delta-layers N] [--rounds N]
#                [--work DIR] [--ftpipe PATH --fixture-hub PATH]
#                [--ftpipe-args "ARGS"]
#
#   --size-mb N     size of the big file in MiB (default 1024; a kill costs
#                   what was sent and not yet durable, a few MiB, so part 2
#                   means little below a few hundred MiB)
#   --tensors K     expert weights changed by the new revision (default 2)
#   --delta-layers N  layers of part 3's repo (a multiple of 4; default 4)
#   --rounds N      interleaved rounds of part 1 (default 2)
#   --work DIR      generated repo and downloads (default
#                   ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/xet)
#   --ftpipe-args "ARGS"  extra arguments for every ftpipe fetch and run
#                   (e.g. "--segment-threshold 16MiB": shards split as
#                   ranges)
#   --ftpipe, --fixture-hub  binaries to use (default: both built with
#                   `cargo build --release` into ${CARGO_TARGET_DIR:-target})
#
# Bytes fetched are counted at the server, the same way for both tools: the
# CAS process's `wchar` (/proc/PID/io: every byte it writes, i.e. sends on
# its sockets while it serves downloads). "Fetched again" after a kill is
# (bytes the CAS sent to the killed run + to the re-run) - (bytes it sent
# to a fresh fetch of the same file in part 1). ftpipe's own account (the
# ledger and the audit's Xet line, `ftpipe audit --json`) is printed beside.
#
# Needs on PATH: local_cas_server (cargo install xet-client --version 1.8.0
# --features simulation --bin local_cas_server --locked), hf (python3 -m pip
# install huggingface_hub hf-xet==1.8.0), python3 with hf_xet, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIZE_MB=1024
K=2
DELTA_LAYERS=4
ROUNDS=2
WORK=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/xet
FT=
HUB=
FT_ARGS=()
while (($#)); do
  case $1 in
    --size-mb) SIZE_MB=$2; shift 2 ;;
    --tensors) K=$2; shift 2 ;;
    --delta-layers) DELTA_LAYERS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --ftpipe) FT=$2; shift 2 ;;
    --ftpipe-args) read -r -a FT_ARGS <<<"$2"; shift 2 ;;
    --fixture-hub) HUB=$2; shift 2 ;;
    -h|--help) sed -n '2,52p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in local_cas_server hf python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool not on PATH (see bench/xet.sh's header)" >&2; exit 2; }
done
python3 -c 'import hf_xet' 2>/dev/null || { echo "python3 cannot import hf_xet (python3 -m pip install hf-xet==1.8.0)" >&2; exit 2; }
if [[ -z $FT || -z $HUB ]]; then
  cargo build --release -q --bin ftpipe && cargo build --release -q -p ftpipe-fixtures --bin fixture-hub
  FT=${CARGO_TARGET_DIR:-$ROOT/target}/release/ftpipe
  HUB=${CARGO_TARGET_DIR:-$ROOT/target}/release/fixture-hub
fi
REPO=bench/xet
BIG=model-00002-of-00002.safetensors
SIZE=$((SIZE_MB << 20))
SRC=$WORK/rev1-$SIZE_MB
DELTA=$WORK/delta-$DELTA_LAYERS
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rm -rf "$WORK/run"; mkdir -p "$WORK/run"
W=$WORK/run

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# ------------------------------------------------------ the repos, once
# generate DIR ARGS...: fixture-hub writes a repo into DIR (kept between runs).
generate() {
  local dir=$1; shift
  [[ -f $dir/.ready ]] && return
  echo "== generating $dir (once)"
  rm -rf "$dir" "$WORK/gen.env"
  "$HUB" --repo "$REPO" --dir "$dir" "$@" >"$WORK/gen.env" 2>"$WORK/gen.err" &
  local gen=$!
  until grep -q '^ENDPOINT=' "$WORK/gen.env" 2>/dev/null; do
    kill -0 "$gen" 2>/dev/null || { echo "fixture-hub failed:" >&2; cat "$WORK/gen.err" >&2; exit 1; }
    sleep 0.2
  done
  kill "$gen"; wait "$gen" 2>/dev/null || true
  touch "$dir/.ready"
}
generate "$SRC" --big-ple-bytes "$SIZE"
generate "$DELTA" --release-demo --release-layers "$DELTA_LAYERS"
FILE_BYTES=$(stat -c %s "$SRC/$BIG")

# ------------------------------------------------------ the CAS and the hub
CAS_PORT=$(free_port)
local_cas_server --host 127.0.0.1 --port "$CAS_PORT" --data-directory "$W/cas" >"$W/cas.log" 2>&1 &
CAS_PID=$!; PIDS+=("$CAS_PID")
CAS=http://127.0.0.1:$CAS_PORT
for _ in $(seq 300); do curl -sf -o /dev/null "$CAS/health" && break; sleep 0.1; done
curl -sf -o /dev/null "$CAS/health" || { echo "local_cas_server did not start:" >&2; cat "$W/cas.log" >&2; exit 1; }
cas_sent() { awk '/^wchar:/ {print $2}' "/proc/$CAS_PID/io"; }

# upload DIR FILE...: hf_xet uploads the files; their lines (path, hashes,
# new bytes) are appended to $W/hashes.jsonl and written to $W/upload.jsonl.
# The xorbs the upload added to the CAS's data directory are listed in
# $W/new-xorbs (size path): what a client holding the previous revision
# needs to fetch.
xorbs() { find "$W/cas" -path '*/xorbs/*' -type f ! -name '*.tagset' -printf '%s %p\n' | LC_ALL=C sort; }
upload() {
  local dir=$1; shift
  xorbs >"$W/xorbs-before"
  # hf_xet's upload cache is keyed by the endpoint's URL and would skip
  # what an earlier CAS on the same port held: one per run.
  (cd "$dir" && HF_HOME="$W/uploader-home" python3 "$ROOT/fixtures/scripts/xet_upload.py" "$CAS" xet-fixture-cas-token "$@") >"$W/upload.jsonl"
  cat "$W/upload.jsonl" >>"$W/hashes.jsonl"
  xorbs | LC_ALL=C comm -13 "$W/xorbs-before" - >"$W/new-xorbs"
}
# Every file of both repos (the hub serves those that are LFS from the CAS).
mapfile -t FILES < <(cd "$SRC" && ls -- *)
upload "$SRC" "${FILES[@]}"
mapfile -t FILES < <(cd "$DELTA" && ls -- *)
upload "$DELTA" "${FILES[@]}"

HUB_PORT=$(free_port); CDN_PORT=$(free_port)
HUB_PID=
# serve DIR: (re)starts the fixture hub on the same ports serving DIR as
# $REPO, its safetensors files through the CAS.
serve() {
  if [[ -n $HUB_PID ]]; then kill "$HUB_PID"; wait "$HUB_PID" 2>/dev/null || true; fi
  rm -f "$W/hub.env" # the wait below must see the new hub's line
  "$HUB" --repo "$REPO" --dir "$1" --port "$HUB_PORT" --cdn-port "$CDN_PORT" \
    --xet-cas "$CAS" --xet-hashes "$W/hashes.jsonl" >"$W/hub.env" 2>"$W/hub.err" &
  HUB_PID=$!; PIDS+=("$HUB_PID")
  until grep -q '^ENDPOINT=' "$W/hub.env" 2>/dev/null; do
    kill -0 "$HUB_PID" 2>/dev/null || { echo "fixture-hub failed:" >&2; cat "$W/hub.err" >&2; exit 1; }
    sleep 0.1
  done
}
serve "$SRC"
EP=http://127.0.0.1:$HUB_PORT
export HF_ENDPOINT=$EP HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_ENABLE_HF_TRANSFER=0
unset HF_HUB_DISABLE_XET HF_HUB_OFFLINE

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== disk: $(df -h --output=source,fstype,size "$WORK" | tail -1 | tr -s ' ')"
echo "== huggingface_hub $(python3 -c 'import huggingface_hub as h; print(h.__version__)'), hf_xet $(python3 -m pip show hf-xet 2>/dev/null | awk '/^Version/ {print $2}'), $(local_cas_server --version); ftpipe $FT"
echo "== repo $REPO: $BIG is $FILE_BYTES bytes (Xet, in local_cas_server on loopback)"

ftpipe_fetch() { "$FT" fetch "$REPO" --endpoint "$EP" --out "$1" --include "$BIG" --quiet "${FT_ARGS[@]}"; }
hf_fetch() { HF_HOME=$1 hf download "$REPO" "$BIG" --quiet; }
audit() { "$FT" audit --json --out "$1"; }
secs() { date +%s.%N; }
# timed NAME DIR CMD...: CMD DIR then sync; appends "NAME secs cas_bytes".
timed() {
  local name=$1 dir=$2; shift 2
  rm -rf "$dir"
  find "$W/cas" -type f -exec cat {} + >/dev/null # the CAS has its data in RAM
  sync
  local b0 t0 t1 b1
  b0=$(cas_sent); t0=$(secs)
  "$@" "$dir" >"$W/$name.log" 2>&1 || { echo "$name failed:" >&2; tail -20 "$W/$name.log" >&2; exit 1; }
  sync; t1=$(secs); b1=$(cas_sent)
  python3 -c "import sys; n,t,b=sys.argv[1],float(sys.argv[2]),int(sys.argv[3]); print(f'   {n:<8} {t:7.2f} s  {$FILE_BYTES/t/1e6:8.1f} MB/s  CAS sent {b} B')" \
    "$name" "$(python3 -c "print($t1 - $t0)")" "$((b1 - b0))"
  echo "$name $(python3 -c "print($t1 - $t0)") $((b1 - b0))" >>"$W/fresh"
}

echo "== 1. fresh fetch of $BIG (+ sync), $ROUNDS interleaved rounds"
for r in $(seq "$ROUNDS"); do
  echo "-- round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  timed ftpipe "$W/ft-fresh" ftpipe_fetch
  timed hf "$W/hf-fresh" hf_fetch
done
cmp "$W/ft-fresh/source/$BIG" "$SRC/$BIG"
cmp "$(find "$W/hf-fresh/hub" -path "*/snapshots/*/$BIG")" "$SRC/$BIG"
audit "$W/ft-fresh" >"$W/audit-fresh.json"

echo "== 2. kill -9 when the CAS has sent 90 % of what it sent the tool's fresh fetch, then run again"
# killed NAME DIR CMD...: CMD DIR killed at 90 %, then CMD DIR again;
# appends "NAME killed_bytes rerun_bytes".
killed() {
  local name=$1 dir=$2; shift 2
  rm -rf "$dir"
  find "$W/cas" -type f -exec cat {} + >/dev/null
  sync
  local k b0 b1 at
  # 90 % of the tool's own fresh fetch (a tool may fetch more than the file;
  # "%.0f": mawk's "%d" stops at 2^31 - 1).
  at=$(awk -v n="$name" '$1 == n {print $3}' "$W/fresh" | sort -n | awk '{v[NR] = $1} END {printf "%.0f", v[int((NR + 1) / 2)] * 0.9}')
  k=$(python3 bench/kill_at.py "$CAS_PID" "$at" "$W/$name-killed.log" -- "$@" "$dir") ||
    { echo "$name finished before the CAS sent $at B ($k): nothing to resume" >&2; exit 1; }
  # (not clean after a kill: exit 4, the JSON still written)
  if [[ $name == ftpipe ]]; then audit "$dir" >"$W/audit-at-kill.json" 2>"$W/audit-at-kill.err" || [[ -s $W/audit-at-kill.json ]]; fi
  b0=$(cas_sent)
  "$@" "$dir" >"$W/$name-rerun.log" 2>&1 || { echo "$name re-run failed:" >&2; tail -20 "$W/$name-rerun.log" >&2; exit 1; }
  sync; b1=$(cas_sent)
  echo "   $name: killed after the CAS sent $(python3 -c "import json,sys; print(json.loads(sys.argv[1])['written'])" "$k") B; re-run: CAS sent $((b1 - b0)) B"
  echo "$name $(python3 -c "import json,sys; print(json.loads(sys.argv[1])['written'])" "$k") $((b1 - b0))" >>"$W/resume"
}
killed ftpipe "$W/ft-kill" bash -c 'exec "$0" fetch "$1" --endpoint "$2" --include "$3" --quiet "${@:4:$#-4}" --out "${!#}"' "$FT" "$REPO" "$EP" "$BIG" "${FT_ARGS[@]}"
killed hf "$W/hf-kill" bash -c 'HF_HOME=$2 exec hf download "$0" "$1" --quiet' "$REPO" "$BIG"
cmp "$W/ft-kill/source/$BIG" "$SRC/$BIG"
cmp "$(find "$W/hf-kill/hub" -path "*/snapshots/*/$BIG")" "$SRC/$BIG"
audit "$W/ft-kill" >"$W/audit-kill.json"

# The shard the new revision changes: the largest holding expert weights
# whose every byte is a finite value (packed FP4 U8, or BF16 whose first
# byte is the low mantissa byte).
SHARD=$(python3 - "$DELTA" <<'PY'
import glob, json, os, struct, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/*.safetensors"), key=os.path.getsize, reverse=True):
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    if any(".mlp.experts." in k and k.endswith(".weight") and t["dtype"] in ("U8", "BF16")
           for k, t in header.items() if k != "__metadata__"):
        print(os.path.basename(f))
        break
else:
    raise SystemExit(f"{sys.argv[1]}: no shard with expert weights")
PY
)
REPO=bench/xet-delta
serve "$DELTA"
echo "== 3. a new revision of $REPO ($DELTA_LAYERS-layer NVFP4 export) changing $K expert tensors of $SHARD ($(stat -c %s "$DELTA/$SHARD") bytes)"
rm -rf "$W/ft-run" "$W/hf-rev"
"$FT" run "$REPO" --endpoint "$EP" --out "$W/ft-run" --quiet "${FT_ARGS[@]}" >"$W/run1.log" 2>&1 || { tail -20 "$W/run1.log" >&2; exit 1; }
HF_HOME=$W/hf-rev hf download "$REPO" --quiet >"$W/hf-rev1.log" 2>&1
audit "$W/ft-run" >"$W/audit-run1.json"
python3 - "$W/ft-run" >"$W/stamps1.json" <<'PY'
import json, os, sys
m = json.load(open(f"{sys.argv[1]}/artifact/manifest.json"))
s = {}
for c in m["components"]:
    st = os.stat(f"{sys.argv[1]}/artifact/{c['path']}")
    s[c["path"]] = [st.st_ino, st.st_mtime_ns]
print(json.dumps(s))
PY
REV2=$W/rev2
rm -rf "$REV2"; cp -al "$DELTA" "$REV2"; rm -f "$REV2/.ready" "$REV2/$SHARD"
# The changed shard: the lowest bit of the first byte of K expert weights
# of its first layer flipped (any packed FP4 byte is finite, and a BF16's
# first byte is its low mantissa byte), the header unchanged (as
# tests/e2e/incremental_rebuild.rs does).
python3 - "$DELTA/$SHARD" "$REV2/$SHARD" "$K" >"$W/changed.json" <<'PY'
import json, struct, sys
src, dst, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
experts = sorted((name, t) for name, t in header.items()
                 if name != "__metadata__" and ".mlp.experts." in name and name.endswith(".weight")
                 and t["dtype"] in ("U8", "BF16"))
layer = experts[0][0].split(".mlp.experts.")[0]
chosen = [(name, t) for name, t in experts if name.startswith(layer + ".mlp.experts.")][:k]
if len(chosen) < k:
    raise SystemExit(f"{src}: {len(chosen)} expert weights in {layer}, {k} asked")
for _, t in chosen:
    data[8 + n + t["data_offsets"][0]] ^= 1
open(dst, "wb").write(data)
print(json.dumps([name for name, _ in chosen]))
PY
upload "$REV2" "$SHARD"
NEW=$(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(d["new_bytes"], d["size"])' "$W/upload.jsonl")
NEW_XORB=$(awk '{s+=$1} END {print s+0}' "$W/new-xorbs")
serve "$REV2"
b0=$(cas_sent)
"$FT" run "$REPO" --endpoint "$EP" --out "$W/ft-run" --repin --quiet "${FT_ARGS[@]}" >"$W/run2.log" 2>&1 || { tail -20 "$W/run2.log" >&2; exit 1; }
sync; b1=$(cas_sent)
REPIN_CAS=$((b1 - b0))
audit "$W/ft-run" >"$W/audit-run2.json"
b0=$(cas_sent)
HF_HOME=$W/hf-rev hf download "$REPO" --quiet >"$W/hf-rev2.log" 2>&1
sync; b1=$(cas_sent)
HF_REV_CAS=$((b1 - b0))
rm -rf "$W/ft-fresh2"
"$FT" run "$REPO" --endpoint "$EP" --out "$W/ft-fresh2" --quiet "${FT_ARGS[@]}" >"$W/run3.log" 2>&1 || { tail -20 "$W/run3.log" >&2; exit 1; }

python3 - "$W" "$FILE_BYTES" "$REPIN_CAS" "$HF_REV_CAS" "$NEW_XORB" $NEW <<'PY'
import json, os, statistics, sys
w, size, repin_cas, hf_rev_cas = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
new_xorb, new_bytes, shard_size = (int(x) for x in sys.argv[5:8])
pct = lambda b: f"{100 * b / size:.2f} %"

print("== results")
fresh = {}
for line in open(f"{w}/fresh"):
    name, t, b = line.split()
    fresh.setdefault(name, []).append((float(t), int(b)))
med = {n: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v)) for n, v in fresh.items()}
for n, (t, b) in med.items():
    print(f"1. fresh fetch {n:<7} median {t:7.2f} s  {size / t / 1e6:8.1f} MB/s  CAS sent {b:.0f} B "
          f"= {b / size:.3f}x the file")
print(f"1. fresh fetch: ftpipe / hf download = {med['ftpipe'][0] / med['hf'][0]:.2f}x  (goal <= 1.0x)")

def xet(a):
    return a.get("xet") or {}
def line(a, path):
    return next(f for f in a["files"] if f["path"] == path)
for l in open(f"{w}/resume"):
    name, killed, rerun = l.split()
    again = int(killed) + int(rerun) - med[name][1]
    print(f"2. resume {name:<7} killed when the CAS had sent {pct(int(killed))} of the file; re-run CAS sent {rerun} B; "
          f"fetched again {again} B = {pct(again)}  (goal for ftpipe <= 1 %)")
a_fresh, a_kill = json.load(open(f"{w}/audit-fresh.json")), json.load(open(f"{w}/audit-kill.json"))
big = "model-00002-of-00002.safetensors"
at_kill = line(json.load(open(f"{w}/audit-at-kill.json")), big)["committed_bytes"]
rerun = int(next(l.split()[2] for l in open(f"{w}/resume") if l.startswith("ftpipe ")))
print(f"2. ftpipe: durable at the kill {at_kill} B ({pct(at_kill)}); the re-run was sent {pct(rerun)} of the file "
      f"for the {pct(size - at_kill)} not yet durable ({rerun / max(size - at_kill, 1):.2f}x; "
      f"a fresh fetch is sent {med['ftpipe'][1] / size:.2f}x the file)")
fl = line(a_kill, big)
print(f"2. ftpipe's own account (bytes received but never recorded before the kill are not in it): ledger transferred {fl['transferred_bytes']} B for a {size} B file "
      f"({pct(fl['transferred_bytes'] - size)} beyond it); Xet compressed bytes {xet(a_kill).get('compressed_bytes')} "
      f"after the kill and re-run vs {xet(a_fresh).get('compressed_bytes')} fresh "
      f"(+{pct(xet(a_kill).get('compressed_bytes', 0) - xet(a_fresh).get('compressed_bytes', 0))})")

a1, a2 = json.load(open(f"{w}/audit-run1.json")), json.load(open(f"{w}/audit-run2.json"))
print(f"3. new revision: {open(f'{w}/changed.json').read().strip()} changed in a {shard_size} B shard; "
      f"hf_xet reported {new_bytes} B of new chunks; the CAS stored {new_xorb} B of new xorbs")
print(f"3. ftpipe run --repin: CAS sent {repin_cas} B = {repin_cas / max(new_xorb, 1):.2f}x the new xorb bytes "
      f"(goal <= 1.05x plus the reconstruction metadata)")
print(f"3. audit Xet line before the repin: {json.dumps(xet(a1))}")
print(f"3. audit Xet line after the repin:  {json.dumps(xet(a2))}")
reused = {k: v for k, v in xet(a2).items() if "reused" in k}
print(f"3. audit 'reused from the previous revision': {reused if reused else 'not reported by this build'}")
print(f"3. hf download of the new revision into its warm cache: CAS sent {hf_rev_cas} B "
      f"= {hf_rev_cas / max(new_xorb, 1):.2f}x the new xorb bytes")

run = f"{w}/ft-run"
m2 = json.load(open(f"{run}/artifact/manifest.json"))
before = json.load(open(f"{w}/stamps1.json"))
rebuilt = set()
for c in m2["components"]:
    st = os.stat(f"{run}/artifact/{c['path']}")
    if before.get(c["path"]) != [st.st_ino, st.st_mtime_ns]:
        rebuilt.add(c["path"])
changed = set(json.load(open(f"{w}/changed.json")))
readers = {t["component"] for t in m2["tensors"] if changed & set(t["sources"])}
print(f"3. components converted again: {len(rebuilt)} of {len(m2['components'])} {sorted(rebuilt)}; "
      f"reading a changed tensor: {len(readers)} {sorted(readers)}; "
      f"{'exactly those' if rebuilt == readers else 'NOT exactly those'}")
same = open(f"{run}/artifact/manifest.json", "rb").read() == open(f"{w}/ft-fresh2/artifact/manifest.json", "rb").read()
print(f"3. manifest after the repin {'equals' if same else 'DIFFERS from'} a fresh build of the new revision")
PY
