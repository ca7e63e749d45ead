#!/usr/bin/env bash
# Conversion scale benchmark (run by hand, not in CI): peak RSS and wall time
# of `ftpipe plan --remote` and `ftpipe convert` on a tiny-dims Qwen4-Exp
# ModelOpt NVFP4 export in the released layout with 512 experts per layer in
# per-expert NVFP4 (48 layers: ~297k tensors, the real export's count and
# names), against the same export with 8 experts per layer (~5k tensors) as
# the baseline. The goal is a peak RSS of at most 256 MiB for the convert.
#
#   bench/convert_scale.sh [--experts N] [--baseline N] [--cache DIR] [--jobs N] [--profile release|debug]
#
# Needs: /usr/bin/time (GNU time), python3. Generated data (~150 MB per
# size) is kept in CACHE (default ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}).
set -euo pipefail
cd "$(dirname "$0")/.."
EXPERTS=512
BASELINE=8
CACHE=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}
JOBS=2
PROFILE=release
while (($#)); do
  case $1 in
    --experts) EXPERTS=$2; shift 2 ;;
    --baseline) BASELINE=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ $PROFILE == release ]]; then
  cargo build --release -q --bin ftpipe && cargo build --release -q -p ftpipe-fixtures --bin fixture-hub
else
  cargo build -q --bin ftpipe && cargo build -q -p ftpipe-fixtures --bin fixture-hub
fi
FT=$PWD/target/$PROFILE/ftpipe
HUB=$PWD/target/$PROFILE/fixture-hub
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $PROFILE build"
mkdir -p "$CACHE"

# run_one NAME EXPERTS: serve the export, plan it remotely, fetch, convert.
run_one() {
  local name=$1 experts=$2 src=$CACHE/scale-$1 out=$CACHE/scale-work-$1
  rm -rf "$out"
  "$HUB" --repo bench/scale --dir "$src" --release-experts "$experts" >"$CACHE/scale-hub-$name.env" 2>"$CACHE/scale-hub-$name.err" &
  local hub=$!
  while ! grep -q ENDPOINT "$CACHE/scale-hub-$name.env" 2>/dev/null; do
    kill -0 "$hub" 2>/dev/null || { echo "fixture-hub exited (see $CACHE/scale-hub-$name.err)" >&2; exit 1; }
    sleep 0.5
  done
  local ep; ep=$(sed -n 's/^ENDPOINT=//p' "$CACHE/scale-hub-$name.env")
  /usr/bin/time -v "$FT" plan bench/scale --endpoint "$ep" --out "$out" --remote >"$CACHE/scale-plan-$name.out" 2>"$CACHE/scale-time-plan-$name.txt"
  "$FT" fetch bench/scale --endpoint "$ep" --out "$out" --quiet >/dev/null 2>&1
  kill "$hub"; wait "$hub" 2>/dev/null || true
  sync
  /usr/bin/time -v "$FT" convert --out "$out" --jobs "$JOBS" --quiet >"$CACHE/scale-convert-$name.out" 2>"$CACHE/scale-time-convert-$name.txt"
  python3 - "$src" "$name" "$experts" <<'PY'
import sys, os, json, struct
src, name, experts = sys.argv[1:]
n = hb = 0
for f in sorted(os.listdir(src)):
    if f.endswith(".safetensors"):
        with open(os.path.join(src, f), "rb") as fh:
            k = struct.unpack("<Q", fh.read(8))[0]
            hb += k
            n += len([t for t in json.loads(fh.read(k)) if t != "__metadata__"])
print(f"{name}: {experts} experts per layer, {n} tensors, {hb} header bytes")
PY
}

run_one base "$BASELINE"
run_one scale "$EXPERTS"

python3 - "$CACHE" <<'PY'
import sys, re
cache = sys.argv[1]
def parse(what, name):
    txt = open(f"{cache}/scale-time-{what}-{name}.txt").read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", txt).group(1))
    t = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", txt).group(1).split(":")
    wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(t)))
    return rss / 1024, wall
for what in ["plan", "convert"]:
    b, s = parse(what, "base"), parse(what, "scale")
    goal = "; goal <= 256 MiB" if what == "convert" else ""
    print(f"{what}: peak RSS {s[0]:.1f} MiB (baseline {b[0]:.1f} MiB, ratio {s[0] / b[0]:.2f}{goal}), "
          f"wall {s[1]:.2f} s (baseline {b[1]:.2f} s)")
PY
