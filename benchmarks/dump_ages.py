"""What the ages cost a dump: bytes, write and read time of one core snapshot
written with and without its traces' ages (dump format 1.1).

About 780,000 live blocks from 200 lines, allocated over 60 epochs with some
freed at random, written through the dump service's ``iter_traces`` (each
batch sorted by age) and read back with ``read_dump``; the best of 5.

    .venv/bin/python benchmarks/dump_ages.py [exact|sample]
"""

from __future__ import annotations

import io
import random
import sys
import time
from typing import Any, Callable

from heapwatch import _core
from heapwatch.formats.dump import DumpHeader, read_dump, write_dump
from heapwatch.server.dumps import age_clock, dump_header, iter_traces

LINES = 200
EPOCHS = 60


def _live_heap(mode: str) -> tuple[_core.Snapshot, list[Any]]:
    random.seed(1)
    source = "\n".join(
        f"def f{i}(n):\n    return [bytes({16 + i % 40}) for _ in range(n)]" for i in range(LINES)
    )
    functions: dict[str, Any] = {}
    exec(compile(source, "/srv/app/generated.py", "exec"), functions)
    # sample mode at a 1-byte interval: every block sampled, as many traces
    _core.start(5, mode, 1) if mode == "sample" else _core.start(5, "exact")  # type: ignore[arg-type]
    kept: list[Any] = []
    for epoch in range(1, EPOCHS + 1):
        _core.set_epoch(epoch)
        for i in random.sample(range(LINES), 40):
            kept.append(functions[f"f{i}"](400))
        if len(kept) > 1500:
            for _ in range(20):
                kept.pop(random.randrange(len(kept)))
    snap = _core.take_snapshot(traces=True)
    _core.stop()
    return snap, kept


def _best(run: Callable[[], Any], repeat: int = 5) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "exact"
    snap, _kept = _live_heap(mode)
    aged = list(iter_traces(snap))
    plain = [trace for trace, _age in aged]
    with_ages = dump_header(snap, trigger="bench", ages=age_clock(snap, time.time(), None))
    without: DumpHeader = dump_header(snap, trigger="bench")
    changes = sum(1 for a, b in zip(aged, aged[1:]) if a[1] != b[1])
    print(f"{mode}: {len(aged)} traces, the age changes {changes} times between two of them")
    for compress in (False, True):
        for name, header, traces in (
            ("without ages", without, plain),
            ("with ages", with_ages, aged),
        ):

            def write(
                header: DumpHeader = header, traces: Any = traces, compress: bool = compress
            ) -> bytes:
                out = io.BytesIO()
                write_dump(out, header, traces, compress=compress)
                return out.getvalue()

            written, data = _best(write)
            read, _dump = _best(lambda data=data: read_dump(io.BytesIO(data)))
            print(
                f"  {'zlib' if compress else 'raw'} {name}: {len(data)} bytes "
                f"({len(data) / len(aged):.2f} B/trace), write {written * 1e3:.0f} ms, "
                f"read_dump {read * 1e3:.0f} ms"
            )


if __name__ == "__main__":
    main()
