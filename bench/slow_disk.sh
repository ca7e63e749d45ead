#!/usr/bin/env bash
# A slow disk for the benches (run by hand as root on a quiet machine, not
# in CI): the block device holding DIR is throttled for the length of one
# command by the root group's cgroup v1 `blkio.throttle.{read,write}_bps_device`,
# which applies to every process and to the kernel's writeback alike (a
# buffered write flushed by `sync` and an `O_DIRECT` write pay the same
# limit). Everything on that device slows down meanwhile.
#
#   bench/slow_disk.sh [--mbps N] [--dir DIR] -- COMMAND...
#
#   --mbps N   the device's read and write limit, in MB/s (default 200)
#   --dir DIR  a directory on the device to slow (default /var/tmp); every
#              `{}` in COMMAND is replaced by it
#
# Before and after the command, the throttled device's speed is measured
# and printed: `dd` of 512 MiB into DIR with `oflag=direct`, and buffered
# with `conv=fsync` (on a virtual disk the two differ: say which one a
# figure was taken against).
#
#   bash bench/slow_disk.sh --mbps 200 -- bash bench/fetch.sh --size 2 --work {}/slow-work ...
#
# Needs: root and a cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio (on
# cgroup v2, `io.max` does the same for writeback only with the memory
# controller on v2; not handled here). The limit is removed on exit.
set -euo pipefail
MBPS=200
DIR=/var/tmp
while (($#)); do
  case $1 in
    --mbps) MBPS=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
(($#)) || { echo "no command given (after --)" >&2; exit 2; }
BLKIO=/sys/fs/cgroup/blkio
[[ -w $BLKIO/blkio.throttle.write_bps_device ]] ||
  { echo "no writable cgroup v1 blkio throttle at $BLKIO (root needed)" >&2; exit 1; }

# MAJOR:MINOR of the whole disk holding DIR (a partition's parent).
SOURCE=$(findmnt -n -o SOURCE --target "$DIR")
DISK=/dev/$(lsblk -n -o PKNAME "$SOURCE" 2>/dev/null | head -1)
[[ $DISK == /dev/ ]] && DISK=$SOURCE
DEV=$(lsblk -d -n -o MAJ:MIN "$DISK" | tr -d ' ')
unthrottle() {
  echo "$DEV 0" >"$BLKIO/blkio.throttle.write_bps_device" || true
  echo "$DEV 0" >"$BLKIO/blkio.throttle.read_bps_device" || true
}
trap unthrottle EXIT
speed() { dd "$@" 2>&1 | awk '/copied/ {print $(NF-1), $NF}'; }
measure() {
  echo "== $1: dd 512 MiB oflag=direct $(speed if=/dev/zero of="$DIR/dd.direct" bs=1M count=512 oflag=direct);" \
    "buffered, conv=fsync $(speed if=/dev/zero of="$DIR/dd.fsync" bs=1M count=512 conv=fsync)"
  rm -f "$DIR/dd.direct" "$DIR/dd.fsync"
}
BPS=$((MBPS * 1000 * 1000))
sync
echo "$DEV $BPS" >"$BLKIO/blkio.throttle.write_bps_device"
echo "$DEV $BPS" >"$BLKIO/blkio.throttle.read_bps_device"
echo "== slow disk: $DISK ($DEV, holding $DIR) throttled to $MBPS MB/s for reads and writes"
measure "before"
CMD=()
for a in "$@"; do CMD+=("${a//\{\}/$DIR}"); done
"${CMD[@]}"
measure "after"
