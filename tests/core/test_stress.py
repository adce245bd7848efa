"""Many threads allocating and freeing while another takes snapshots."""

from __future__ import annotations

import random
import threading
import time
from types import ModuleType

import pytest


def _churn(stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    live: list[object] = []
    while not stop.is_set():
        for _ in range(200):
            if live and rng.random() < 0.45:
                live.pop(rng.randrange(len(live)))
            elif rng.random() < 0.5:
                live.append(bytearray(rng.randrange(1, 3000)))
            elif rng.random() < 0.5:
                live.append([None] * rng.randrange(1, 200))
            elif live and isinstance(live[-1], list):
                live[-1].extend(range(rng.randrange(1, 100)))  # realloc
            else:
                live.append({str(i): i for i in range(rng.randrange(1, 30))})
        if len(live) > 3000:
            del live[:1500]
        # Hand the GIL over between batches: with nine threads wanting it the
        # snapshot thread would otherwise wait many switch intervals per step.
        time.sleep(0)


@pytest.mark.parametrize(("mode", "nframe"), [("exact", 1), ("exact", 25), ("sample", 5)])
def test_eight_threads_churn_while_snapshots_and_peak_resets_run(
    core: ModuleType, hwtest: ModuleType, mode: str, nframe: int
) -> None:
    # Given 8 threads churning (and one allocating without the GIL),
    core.start(nframe, mode, 2048)
    stop = threading.Event()
    threads = [threading.Thread(target=_churn, args=(stop, i)) for i in range(8)]
    threads.append(threading.Thread(target=hwtest.churn_nogil, args=(300_000, 4000)))
    for thread in threads:
        thread.start()
    try:
        # when another thread takes snapshots and resets the peak,
        for round_ in range(40):
            snapshot = core.take_snapshot(traces=(round_ % 2 == 0), reset_peak=True)
            # then every snapshot is consistent: its traces sum to its total
            if snapshot.has_traces:
                traces = snapshot.traces()
                if mode == "exact":
                    assert sum(size for _d, size, _f, _t in traces) == snapshot.traced
                assert len(traces) == snapshot.ntraces
                # Each trace tuple is a traced block: keeping them would make
                # the next snapshot bigger, and so on.
                del traces
            groups = snapshot.group("lineno")
            assert groups.total[0] == snapshot.traced
            assert sum(size for _f, size, _c in groups.statistics()) == snapshot.traced
            assert snapshot.peak >= snapshot.traced
            core._check_invariants()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    core._check_invariants()


def test_start_and_stop_while_other_threads_allocate(core: ModuleType, hwtest: ModuleType) -> None:
    stop = threading.Event()
    threads = [threading.Thread(target=_churn, args=(stop, i)) for i in range(4)]
    threads += [threading.Thread(target=hwtest.churn_nogil, args=(400_000, 3000)) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for i in range(60):
            core.start(1 + i % 3, "exact" if i % 2 else "sample", 1024)
            core._check_invariants()
            if i % 3 == 0:
                core.clear_traces()
            core.take_snapshot(traces=False)
            core.stop()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not core.hooks_installed()


def test_hooks_swapped_in_and_out_while_threads_allocate_without_the_gil(
    core: ModuleType, hwtest: ModuleType
) -> None:
    # Given threads calling PyMem_RawMalloc, realloc and free without the GIL,
    threads = [threading.Thread(target=hwtest.churn_nogil, args=(3_000_000, 64)) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        # when the hooks go into the RAW chain and out of it again and again,
        swaps = 0
        while any(thread.is_alive() for thread in threads) and swaps < 3000:
            core.start(1, "exact" if swaps % 2 else "sample", 1024)
            core.stop()
            swaps += 1
    finally:
        for thread in threads:
            thread.join()
    # then every call found a whole allocator (a torn function pointer, half
    # ours and half the old one's, crashed the process: Debian's 3.15).
    assert not core.hooks_installed()
    assert swaps > 0
