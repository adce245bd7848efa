"""What one push of a cycle's profile costs (issue 25), at 10k and 100k
distinct sites: the pyroscope exporter's work per cycle, in its own thread.
A measurement, never a test: nothing here passes or fails.

    .venv/bin/python benchmarks/profile_push.py                 # 10k and 100k sites
    .venv/bin/python benchmarks/profile_push.py --sites 1000,10000 --rounds 5

Each site count runs in a fresh interpreter: tracing started with
``_core.start(1)`` (exact mode, nframe 1), then one generated module of N
lines, each keeping one 64-byte block and allocating and freeing another
(so every site holds live bytes and allocation totals).  Then, per round:
``take_snapshot(traces=False)`` (the cycle's, not counted in the push), the
encoding (``encode_go_heap_profile``: the four sample types) and one POST of
the body to a loopback HTTP receiver that reads it and answers 200, each
timed; the median of the rounds is printed, with the profile's size.
"""

from __future__ import annotations

import argparse
import http.server
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from run import child_env

HERE = Path(__file__).resolve().parent


def _child(sites: int, rounds: int) -> dict[str, Any]:
    from heapwatch import _core
    from heapwatch.formats.pprof import encode_go_heap_profile

    class Sink(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ingest"

    _core.start(1)
    source = "\n".join(f"keep.append(bytes(64)); b = bytes({100 + i % 50})" for i in range(sites))
    keep: list[bytes] = []
    exec(compile(source, "<sites>", "exec"), {"keep": keep})
    encode, post, size = [], [], 0
    for _ in range(rounds):
        snap = _core.take_snapshot(traces=False)
        started = time.perf_counter()
        body = encode_go_heap_profile(snap, default_sample_type="inuse_space")
        encoded = time.perf_counter()
        del snap
        request = urllib.request.Request(url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
        posted = time.perf_counter()
        encode.append(encoded - started)
        post.append(posted - encoded)
        size = len(body)
    _core.stop()
    server.shutdown()
    return {
        "sites": sites,
        "encode_s": statistics.median(encode),
        "post_s": statistics.median(post),
        "bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", default="10000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(_child(args.child, args.rounds)))
        return
    print(f"profile push per cycle, {args.rounds} rounds, median; python {sys.version.split()[0]}")
    print(f"{'sites':>8} {'encode':>9} {'POST':>9} {'profile':>10}")
    for sites in (int(s) for s in args.sites.split(",")):
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__)),
                "--child",
                str(sites),
                "--rounds",
                str(args.rounds),
            ],
            env=child_env(),
            capture_output=True,
            text=True,
            check=True,
            cwd=HERE,
        )
        row = json.loads(out.stdout.splitlines()[-1])
        print(
            f"{row['sites']:>8} {row['encode_s'] * 1000:>7.0f}ms {row['post_s'] * 1000:>7.1f}ms "
            f"{row['bytes'] / 1024:>8.0f}KiB"
        )


if __name__ == "__main__":
    main()
