#!/usr/bin/env bash
# Conversion benchmark (run by hand, not in CI): peak RSS and throughput of
# `ftpipe convert` on a checkpoint holding one PLE tensor of >= 4 GiB, against
# baselines run in the same invocation:
#   * the same conversion of a checkpoint whose PLE tensor is 1/100 the size
#     (peak RSS must not grow with the tensor: streaming, not whole tensors);
#   * `cp` + `sync` of the big source shard on the same volume (the I/O floor
#     for reading it and writing something).
#
#   bench/convert.sh [--gib N] [--cache DIR] [--jobs N]
#
# Needs: /usr/bin/time (GNU time), python3. Generated data is kept in CACHE
# (default ${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}); ~3x the size is needed.
set -euo pipefail
cd "$(dirname "$0")/.."
GIB=4.5
CACHE=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}
JOBS=2
while (($#)); do
  case $1 in
    --gib) GIB=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --jobs) JOBS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
BYTES=$(python3 -c "print(int($GIB * (1 << 30)))")
SMALL=$((BYTES / 100))
cargo build --release --workspace --bins -q
FT=$PWD/target/release/ftpipe
HUB=$PWD/target/release/fixture-hub
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

peak_kib() { grep 'Maximum resident set size' "$1" | awk '{print $NF}'; }
wall_s() { python3 - "$1" <<'PY'
import sys
for line in open(sys.argv[1]):
    if 'Elapsed (wall clock)' in line:
        t = line.split()[-1].split(':')
        print(sum(float(x) * 60 ** i for i, x in enumerate(reversed(t))))
PY
}

# convert_one NAME PLE_BYTES: serve, fetch, then time `ftpipe convert`.
convert_one() {
  local name=$1 bytes=$2 src=$CACHE/convert-$1 out=$CACHE/work-$1
  rm -rf "$out"
  "$HUB" --repo bench/big-ple --dir "$src" --big-ple-bytes "$bytes" >"$CACHE/hub-$name.env" 2>"$CACHE/hub-$name.err" &
  local hub=$!
  while ! grep -q ENDPOINT "$CACHE/hub-$name.env" 2>/dev/null; do
    kill -0 "$hub" 2>/dev/null || { echo "fixture-hub exited (see $CACHE/hub-$name.err)" >&2; exit 1; }
    sleep 0.5
  done
  local ep; ep=$(sed -n 's/^ENDPOINT=//p' "$CACHE/hub-$name.env")
  "$FT" fetch bench/big-ple --endpoint "$ep" --out "$out" --quiet >/dev/null 2>&1
  kill "$hub"; wait "$hub" 2>/dev/null || true
  sync
  /usr/bin/time -v "$FT" convert --out "$out" --jobs "$JOBS" --quiet >"$CACHE/convert-$name.out" 2>"$CACHE/time-$name.txt"
  local shard; shard=$(ls -S "$out"/source/*.safetensors | head -1)
  echo "$name: tensor shard $(stat -c %s "$shard") bytes, artifact $(du -sb "$out/artifact" | cut -f1) bytes," \
       "convert $(wall_s "$CACHE/time-$name.txt") s, peak RSS $(peak_kib "$CACHE/time-$name.txt") KiB"
}

mkdir -p "$CACHE"
convert_one small "$SMALL"
convert_one big "$BYTES"

SHARD=$(ls -S "$CACHE"/work-big/source/*.safetensors | head -1)
sync
/usr/bin/time -v sh -c "cp '$SHARD' '$CACHE/cp-baseline' && sync" 2>"$CACHE/time-cp.txt"
rm -f "$CACHE/cp-baseline"

python3 - "$CACHE" "$(stat -c %s "$SHARD")" <<'PY'
import sys, re
cache, shard = sys.argv[1], int(sys.argv[2])
def parse(name):
    txt = open(f"{cache}/time-{name}.txt").read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", txt).group(1))
    t = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", txt).group(1).split(":")
    wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(t)))
    return rss, wall
small, big, cp = parse("small"), parse("big"), parse("cp")
print(f"peak RSS: big {big[0] / 1024:.1f} MiB, small {small[0] / 1024:.1f} MiB "
      f"(ratio {big[0] / small[0]:.2f}; goal < 512 MiB)")
print(f"convert big: {big[1]:.1f} s = {shard / big[1] / 1e9:.2f} GB/s of source; "
      f"cp+sync of the same shard: {cp[1]:.1f} s ({shard / cp[1] / 1e9:.2f} GB/s); "
      f"convert / cp = {big[1] / cp[1]:.2f}x")
PY
