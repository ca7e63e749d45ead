#!/usr/bin/env bash
# OCI registry benchmark (run by hand, not in CI; issue 38's goals):
# `ftpipe publish DIR oci://…` and `ftpipe pull oci://…` of a converted
# artifact against the oras Python SDK (`oras.client.OrasClient`, the
# artifact's files pushed as layers with the ModelPack media types) and
# `skopeo copy`, all against the CNCF distribution registry
# (`docker-registry`, anonymous, plain HTTP) on loopback, in one
# invocation:
#   1. publish: each tool pushes the artifact into a registry whose storage
#      is fresh (so no tool finds blobs another pushed): ftpipe publish,
#      oras push, skopeo copy from an OCI layout of the same artifact;
#   2. pull: each tool pulls what ftpipe published (the registry's files
#      read into the page cache first): ftpipe pull, oras pull, skopeo copy
#      to a dir:; ftpipe's pull is checked with `verify --deep`;
#   3. a publish kill -9ed when the registry has written 90 % of the
#      artifact's bytes, then run again: the bytes resent, as % of the
#      artifact (and the same for oras push, which starts its blob over).
# Every timed command ends with `sync`; rounds are interleaved, medians and
# the ratios against the faster peer printed.
#
#   bench/oci.sh [--size-mb N | --artifact DIR/artifact] [--rounds N]
#                [--work DIR] [--ftpipe PATH --fixture-hub PATH]
#
#   --size-mb N     artifact size in MiB (default 2048): a qwen4_exp repo
#                   whose PLE table is 4.57 times that
#                   (`fixture-hub --big-ple-bytes`), converted by `ftpipe
#                   run` once into WORK (as bench/s3.sh's artifact)
#   --artifact DIR/artifact  use this converted artifact instead
#   --rounds N      interleaved rounds of parts 1 and 2 (default 2)
#   --work DIR      default ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/oci
#   --ftpipe, --fixture-hub  binaries to use (default: both built with
#                   `cargo build --release` into ${CARGO_TARGET_DIR:-target})
#
# Bytes received are counted at the registry, the same way for every tool:
# the registry process's `wchar` (/proc/PID/io: every byte it writes, i.e.
# the blob bytes it stores plus its small answers). "Resent" after a kill is
# (bytes the registry wrote for the killed publish + for the re-run) - (bytes
# it wrote for a clean publish of the same artifact in part 1).
#
# Needs on PATH: docker-registry (apt-get install docker-registry), skopeo
# (apt-get install skopeo), python3 with oras (python3 -m pip install
# oras==0.2.38), curl.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SIZE_MB=2048
ART=
ROUNDS=2
WORK=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}/oci
FT=
HUB=
while (($#)); do
  case $1 in
    --size-mb) SIZE_MB=$2; shift 2 ;;
    --artifact) ART=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --ftpipe) FT=$2; shift 2 ;;
    --fixture-hub) HUB=$2; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in docker-registry skopeo python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool not on PATH (see bench/oci.sh's header)" >&2; exit 2; }
done
python3 -c 'import oras.client' 2>/dev/null || { echo "python3 cannot import oras (python3 -m pip install oras==0.2.38)" >&2; exit 2; }
if [[ -z $FT || -z $HUB ]]; then
  cargo build --release -q --bin ftpipe && cargo build --release -q -p ftpipe-fixtures --bin fixture-hub
  FT=${CARGO_TARGET_DIR:-$ROOT/target}/release/ftpipe
  HUB=${CARGO_TARGET_DIR:-$ROOT/target}/release/fixture-hub
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mkdir -p "$WORK"
W=$WORK/run
rm -rf "$W"; mkdir -p "$W"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# ------------------------------------------------------ the artifact, once
if [[ -z $ART ]]; then
  GEN=$WORK/art-$SIZE_MB
  if [[ ! -f $GEN/ready ]]; then
    echo "== generating a qwen4_exp repo and converting it into $GEN (once)"
    rm -rf "$GEN"; mkdir -p "$GEN"
    "$HUB" --repo bench/oci --dir "$GEN/repo" --big-ple-bytes $((SIZE_MB * 457 / 100 << 20)) >"$GEN/hub.env" 2>"$GEN/hub.err" &
    gen=$!; PIDS+=("$gen")
    until grep -q '^ENDPOINT=' "$GEN/hub.env" 2>/dev/null; do
      kill -0 "$gen" 2>/dev/null || { echo "fixture-hub failed:" >&2; cat "$GEN/hub.err" >&2; exit 1; }
      sleep 0.2
    done
    "$FT" run bench/oci --endpoint "$(sed -n 's/^ENDPOINT=//p' "$GEN/hub.env")" --out "$GEN/dir" --quiet
    kill "$gen"; wait "$gen" 2>/dev/null || true
    rm -rf "$GEN/repo" "$GEN/dir/source"
    touch "$GEN/ready"
  fi
  ART=$GEN/dir/artifact
fi
[[ -f $ART/manifest.json ]] || { echo "$ART: no manifest.json (--artifact DIR/artifact)" >&2; exit 2; }
BYTES=$(du -sb "$ART" | cut -f1)
FILES=$(find "$ART" -type f | wc -l)

# ------------------------------------------------------ registries
REG_PID=
REG=
# registry NAME: (re)starts the registry with fresh, empty storage in $W/NAME.
registry() {
  if [[ -n $REG_PID ]]; then kill "$REG_PID"; wait "$REG_PID" 2>/dev/null || true; fi
  local dir=$W/$1 port
  rm -rf "$dir"; mkdir -p "$dir"
  port=$(free_port)
  printf 'version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%s\n  secret: ftpipe-bench-registry-secret\n' \
    "$dir/storage" "$port" >"$dir/config.yml"
  docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 &
  REG_PID=$!; PIDS+=("$REG_PID")
  REG=127.0.0.1:$port
  for _ in $(seq 200); do curl -sf -o /dev/null "http://$REG/v2/" && return; sleep 0.05; done
  echo "docker-registry did not start:" >&2; cat "$dir/registry.log" >&2; exit 1
}
reg_written() { awk '/^wchar:/ {print $2}' "/proc/$REG_PID/io"; }

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== disk: $(df -h --output=source,fstype,size "$WORK" | tail -1 | tr -s ' ')"
echo "== docker-registry $(docker-registry --version 2>&1 | awk '{print $NF}'), $(skopeo --version), oras $(python3 -m pip show oras 2>/dev/null | awk '/^Version/ {print $2}'); ftpipe $FT"
echo "== artifact $ART: $BYTES bytes in $FILES files"

# The tools' inputs: ftpipe publishes DIR (DIR/artifact hard links to the
# artifact's files); oras pushes each file as a ModelPack layer with a
# ModelPack config; skopeo copies an OCI layout of ftpipe's push (made
# once, untimed).
PUB=$W/pub; mkdir -p "$PUB"; cp -al "$ART" "$PUB/artifact"
python3 - "$W/modelpack-config.json" <<'PY'
import json, sys
json.dump({"descriptor": {"name": "bench"}, "config": {"format": "ftw"},
           "modelfs": {"type": "layers", "diffIds": []}}, open(sys.argv[1], "w"))
PY
ORAS_PUSH='
import json, os, sys, tempfile, oras.client
host, target, artifact, config = sys.argv[1:5]
files, annotations = [], {}
for root, dirs, names in os.walk(artifact):
    for name in names:
        full = os.path.join(root, name)
        rel = os.path.relpath(full, artifact)
        raw = "application/vnd.cncf.model.weight.v1.raw"
        if rel in ("manifest.json", "placement.json"):
            raw = "application/vnd.cncf.model.weight.config.v1.raw"
        files.append(f"{full}:{raw}")
        annotations[full] = {"org.cncf.model.filepath": rel, "org.opencontainers.image.title": rel}
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(annotations, f)
client = oras.client.OrasClient(hostname=host, insecure=True)
client.push(target=target, files=files, disable_path_validation=True, annotation_file=f.name,
            manifest_config=f"{config}:application/vnd.cncf.model.config.v1+json")
'
ORAS_PULL='
import sys, oras.client
host, target, outdir = sys.argv[1:4]
oras.client.OrasClient(hostname=host, insecure=True).pull(target=target, outdir=outdir)
'
export HOME=$W/home; mkdir -p "$HOME" # no credentials of the user's
unset REGISTRY_AUTH_FILE DOCKER_CONFIG
SKOPEO=(skopeo --insecure-policy)
pub_ftpipe() { "$FT" publish "$PUB" "oci://$REG/bench/ftpipe:v1" --plain-http --quiet; }
pub_oras() { python3 -c "$ORAS_PUSH" "$REG" "$REG/bench/oras:v1" "$ART" "$W/modelpack-config.json"; }
pub_skopeo() { "${SKOPEO[@]}" copy -q --preserve-digests --dest-tls-verify=false "oci:$W/layout:v1" "docker://$REG/bench/skopeo:v1"; }
pull_ftpipe() { "$FT" pull "oci://$REG/bench/ftpipe:v1" --out "$1" --plain-http --quiet; }
pull_oras() { python3 -c "$ORAS_PULL" "$REG" "$REG/bench/ftpipe:v1" "$1"; }
pull_skopeo() { "${SKOPEO[@]}" copy -q --src-tls-verify=false "docker://$REG/bench/ftpipe:v1" "dir:$1"; }

secs() { date +%s.%N; }
# timed NAME CMD...: CMD then sync; appends "NAME secs registry_written".
timed() {
  local name=$1; shift
  sync
  local b0 t0 t1 b1
  b0=$(reg_written); t0=$(secs)
  "$@" >"$W/$name.log" 2>&1 || { echo "$name failed:" >&2; tail -20 "$W/$name.log" >&2; exit 1; }
  sync; t1=$(secs); b1=$(reg_written)
  python3 -c "import sys; n,t=sys.argv[1],float(sys.argv[2]); print(f'   {n:<14} {t:7.2f} s  {$BYTES/t/1e6:8.1f} MB/s  registry wrote {sys.argv[3]} B')" \
    "$name" "$(python3 -c "print($t1 - $t0)")" "$((b1 - b0))"
  echo "$name $(python3 -c "print($t1 - $t0)") $((b1 - b0))" >>"$W/times"
}

registry layout-source
pub_ftpipe >"$W/layout-pub.log" 2>&1 || { tail -20 "$W/layout-pub.log" >&2; exit 1; }
"${SKOPEO[@]}" copy -q --preserve-digests --src-tls-verify=false "docker://$REG/bench/ftpipe:v1" "oci:$W/layout:v1"

# Every tool's input is read into the page cache before it runs.
warm_inputs() { find "$ART" "$W/layout" -type f -exec cat {} + >/dev/null; }
echo "== 1. publish (each into a fresh registry), $ROUNDS interleaved rounds"
for r in $(seq "$ROUNDS"); do
  echo "-- round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  rm -rf "$PUB/.ftpipe"
  registry pub-ftpipe; warm_inputs; timed publish-ftpipe pub_ftpipe
  registry pub-oras; warm_inputs; timed publish-oras pub_oras
  registry pub-skopeo; warm_inputs; timed publish-skopeo pub_skopeo
done

echo "== 2. pull of ftpipe's push, $ROUNDS interleaved rounds"
rm -rf "$PUB/.ftpipe"
registry pull-source
pub_ftpipe >"$W/pull-source.log" 2>&1 || { tail -20 "$W/pull-source.log" >&2; exit 1; }
warm() { find "$W/pull-source/storage" -type f -exec cat {} + >/dev/null; } # the registry has the data in RAM
for r in $(seq "$ROUNDS"); do
  echo "-- round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  for tool in ftpipe oras skopeo; do
    rm -rf "$W/pulled-$tool"; warm
    timed "pull-$tool" "pull_$tool" "$W/pulled-$tool"
  done
done
"$FT" verify --deep "$W/pulled-ftpipe/artifact" >"$W/verify.log" 2>&1 || { cat "$W/verify.log" >&2; exit 1; }
diff -r "$ART" "$W/pulled-ftpipe/artifact" >/dev/null || { echo "ftpipe's pull differs from the artifact" >&2; exit 1; }
diff -r "$ART" "$W/pulled-oras" >/dev/null || { echo "oras's pull differs from the artifact" >&2; exit 1; }

echo "== 3. publish kill -9ed when the registry has written 90 % of $BYTES bytes, then run again"
AT=$((BYTES * 9 / 10))
# killed NAME: publish_NAME into a fresh registry, kill -9ed at 90 %, then
# run again; appends "NAME killed_written rerun_written". kill_at.py runs a
# command, not a shell function: the function through bash -c.
export FT PUB ART W ORAS_PUSH REG
killed() {
  local name=$1 k b0 b1
  registry "kill-$name"
  local cmd=(bash -c "$(declare -f "pub_$name"); pub_$name")
  k=$(python3 bench/kill_at.py "$REG_PID" "$AT" "$W/kill-$name.log" -- "${cmd[@]}") ||
    { echo "$name finished before the registry wrote 90 % ($k): nothing to resume" >&2; exit 1; }
  k=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['written'])" "$k")
  sync; b0=$(reg_written)
  "${cmd[@]}" >"$W/rerun-$name.log" 2>&1 || { echo "$name re-run failed:" >&2; tail -20 "$W/rerun-$name.log" >&2; exit 1; }
  sync; b1=$(reg_written)
  echo "   $name: killed after the registry wrote $k B; re-run: it wrote $((b1 - b0)) B;" \
    "requests it refused as BLOB_UPLOAD_INVALID (a session it will not resume): $(grep -c 'blob upload invalid' "$W/kill-$name/registry.log" || true)"
  echo "$name $k $((b1 - b0))" >>"$W/resume"
}
rm -rf "$PUB/.ftpipe"
warm_inputs
killed ftpipe
killed oras

python3 - "$W" "$BYTES" <<'PY'
import statistics, sys
w, size = sys.argv[1], int(sys.argv[2])
runs = {}
for line in open(f"{w}/times"):
    name, t, b = line.split()
    runs.setdefault(name, []).append((float(t), int(b)))
med = {n: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v)) for n, v in runs.items()}
print("== results (medians)")
for n, (t, b) in med.items():
    print(f"{n:<15} {t:7.2f} s  {size / t / 1e6:8.1f} MB/s  registry wrote {b:.0f} B")
for op in ("publish", "pull"):
    peers = {p: med[f"{op}-{p}"][0] for p in ("oras", "skopeo")}
    best = min(peers, key=peers.get)
    print(f"{op}: ftpipe / faster peer ({best}) = {med[f'{op}-ftpipe'][0] / peers[best]:.2f}x  (goal <= 1.0x)")
for line in open(f"{w}/resume"):
    name, killed, rerun = line.split()
    again = int(killed) + int(rerun) - med[f"publish-{name}"][1]
    print(f"resume {name}: killed at {100 * int(killed) / size:.1f} % written; re-run wrote {rerun} B; "
          f"resent {again} B = {100 * again / size:.2f} % of the artifact (goal for ftpipe <= 1 %)")
PY
