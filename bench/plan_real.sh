#!/usr/bin/env bash
# `ftpipe plan --remote` at the released Qwen4-Exp's real geometry (run by
# hand, not in CI): `fixture-hub --release-real-sparse bf16|nvfp4` writes the
# BF16 release (131 files, ~360 GB) or the ModelOpt NVFP4 export (206 files,
# ~130 GB) as sparse files (real headers and lengths, holes for data) plus
# the digest sidecar, then serves them with --digest-sidecar, so start-up
# reads only each file's header and checks with SEEK_DATA that the rest is
# a hole. Each plan runs under `/usr/bin/time -v` against a fresh DIR.
#
#   bench/plan_real.sh [--cache DIR] [--profile release|debug] [--flavours "bf16 nvfp4"]
#
# Needs: /usr/bin/time (GNU time), a filesystem with sparse files and
# SEEK_DATA. The first run per flavour generates the files and hashes their
# zeros once (minutes; on disk: the headers only); later runs reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${FTPIPE_BENCH_CACHE:-/var/tmp/ftpipe-bench}
PROFILE=release
FLAVOURS="bf16 nvfp4"
while (($#)); do
  case $1 in
    --cache) CACHE=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --flavours) FLAVOURS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ $PROFILE == release ]]; then
  cargo build --release -q --bin ftpipe && cargo build --release -q -p ftpipe-fixtures --bin fixture-hub
  DIRNAME=release
else
  cargo build -q --bin ftpipe && cargo build -q -p ftpipe-fixtures --bin fixture-hub
  DIRNAME=debug
fi
FT=$PWD/target/$DIRNAME/ftpipe
HUB=$PWD/target/$DIRNAME/fixture-hub
mkdir -p "$CACHE"
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $PROFILE build"

for f in $FLAVOURS; do
  src=$CACHE/real-$f out=$CACHE/real-work-$f
  rm -rf "$out"
  "$HUB" --repo acme/real-$f --dir "$src" --release-real-sparse "$f" --digest-sidecar \
    >"$CACHE/real-hub-$f.env" 2>"$CACHE/real-hub-$f.err" &
  hub=$!
  while ! grep -q ENDPOINT "$CACHE/real-hub-$f.env" 2>/dev/null; do
    kill -0 "$hub" 2>/dev/null || { echo "fixture-hub exited (see $CACHE/real-hub-$f.err)" >&2; exit 1; }
    sleep 0.5
  done
  ep=$(sed -n 's/^ENDPOINT=//p' "$CACHE/real-hub-$f.env")
  echo "$f: load $(cut -d' ' -f1-3 /proc/loadavg) before the plan"
  /usr/bin/time -v "$FT" plan acme/real-$f --endpoint "$ep" --out "$out" --remote \
    >"$CACHE/real-plan-$f.out" 2>"$CACHE/real-time-$f.txt"
  kill "$hub"; wait "$hub" 2>/dev/null || true
  sed -n 's/^fixture-hub: //p' "$CACHE/real-hub-$f.err" | sed "s/^/$f: hub: /"
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$CACHE/real-time-$f.txt")
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$CACHE/real-time-$f.txt")
  echo "$f: plan --remote wall $wall, peak RSS $((rss / 1024)) MiB"
  head -1 "$CACHE/real-plan-$f.out" | sed "s/^/$f: /"
  grep -E '^(total|omitted)' "$CACHE/real-plan-$f.out" | sed "s/^/$f: /"
done
