#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS (default 600) with the memory
# limits that are part of the property, minimizes each corpus, and writes
# the results table in docs/fuzzing.md.
#
#   fuzz/run.sh [SECONDS]          all targets, one after the other
#   JOBS=2 fuzz/run.sh 600         two targets at a time
#   TARGETS="index_json ftw_reader" fuzz/run.sh 60
#
# Needs the nightly toolchain and cargo-fuzz:
#   rustup toolchain install nightly
#   cargo install cargo-fuzz --locked
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
jobs=${JOBS:-1}
targets=${TARGETS:-$(cargo +nightly fuzz list)}
logs=$(mktemp -d)
today=$(date -u +%Y-%m-%d)

cargo +nightly fuzz build -O >/dev/null

one() {
  local t=$1 log="$logs/$1.log"
  mkdir -p "corpus/$t" "artifacts/$t"
  local before
  before=$(find "artifacts/$t" -type f | wc -l)
  # -rss_limit_mb / -malloc_limit_mb: an input that makes a parser allocate
  # past them is a finding (each parser has a named MAX_* limit far below).
  cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=512 -malloc_limit_mb=256 \
    -print_final_stats=1 -timeout=10 >"$log" 2>&1 || true
  local after
  after=$(find "artifacts/$t" -type f | wc -l)
  cargo +nightly fuzz cmin -O "$t" "corpus/$t" >>"$log" 2>&1 || true
  local execs cov ft corpus
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$log" | tail -1)
  cov=$(grep -oP '#[0-9]+\s+DONE\s+cov: \K[0-9]+' "$log" | tail -1)
  ft=$(grep -oP '#[0-9]+\s+DONE\s+cov: [0-9]+ ft: \K[0-9]+' "$log" | tail -1)
  corpus=$(find "corpus/$t" -type f | wc -l)
  echo "| \`$t\` | $today | $secs | ${execs:-?} | ${cov:-?} | ${ft:-?} | $corpus | $((after - before)) |" >"$logs/$t.row"
  echo "$t: ${execs:-?} execs, cov ${cov:-?}, ft ${ft:-?}, corpus $corpus, new crashes $((after - before))" >&2
}

running=0
for t in $targets; do
  one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
done
wait

# Rows of targets not run this time are kept, and so is the list of runs.
for t in $(cargo +nightly fuzz list); do
  [ -f "$logs/$t.row" ] || sed -n '/^<!-- results -->$/,$p' ../docs/fuzzing.md |
    grep -F "| \`$t\` | 20" >"$logs/$t.row" || true
done
{
  sed -n '1,/^<!-- results -->$/p' ../docs/fuzzing.md
  echo
  echo "| target | date | seconds | executions | coverage (cov) | features (ft) | corpus files | new crashes |"
  echo "|---|---|---|---|---|---|---|---|"
  for t in $(cargo +nightly fuzz list); do cat "$logs/$t.row"; done
  echo
  echo "Runs:"
  echo
  sed -n '/^<!-- results -->$/,$p' ../docs/fuzzing.md | grep -E '^- [0-9]{4}-' || true
  echo "- $today: $(echo $targets | wc -w) target(s) for $secs s, $jobs at a time, on $(nproc) cores ($(uname -m)); load at the end $(cut -d' ' -f1-3 /proc/loadavg)."
} >"$logs/fuzzing.md"
mv "$logs/fuzzing.md" ../docs/fuzzing.md
echo "wrote docs/fuzzing.md" >&2
