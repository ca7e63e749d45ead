#!/usr/bin/env python3
"""Runs a command and kill -9s it (its whole process group) once a server
has written THRESHOLD bytes since the start: for the benches' "killed at
about 90 %" figures (bench/xet.sh, bench/oci.sh).

usage: kill_at.py SERVER_PID THRESHOLD LOG -- CMD...

The server's written bytes are `wchar` of /proc/SERVER_PID/io: every
write(2)/writev(2) it makes, i.e. the bytes it sends on its sockets (a CAS
serving a download) or writes to its storage (a registry receiving an
upload), whichever tool is the client. Polled every 5 ms. CMD's output goes
to LOG. Prints one JSON object: {"killed": true|false, "written": N,
"secs": S}; exits 1 when CMD ended (by itself) before the threshold, since
then there was nothing to resume.
"""

import json
import os
import signal
import subprocess
import sys
import time


def written(pid: str) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/io has no wchar line")


def main() -> int:
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    pid, threshold, log, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5:]
    start = written(pid)
    t0 = time.time()
    with open(log, "w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        killed = False
        while child.poll() is None:
            if written(pid) - start >= threshold:
                os.killpg(child.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.005)
        child.wait()
    done = written(pid) - start
    print(json.dumps({"killed": killed, "written": done, "secs": round(time.time() - t0, 3)}))
    return 0 if killed else 1


if __name__ == "__main__":
    sys.exit(main())
