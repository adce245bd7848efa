"""The C aggregation agrees with the reference model on the same snapshot."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import reference

KEYS = [
    ("lineno", False),
    ("filename", False),
    ("traceback", False),
    ("lineno", True),
    ("filename", True),
]


def _workload(n: int) -> list[Any]:
    def leaf(size: int) -> bytearray:
        return bytearray(size)

    def branch(i: int) -> Any:
        if i % 3 == 0:
            return leaf(100 + i % 7)
        if i % 3 == 1:
            return [leaf(50), leaf(60)]
        return {i: leaf(3000)}

    return [branch(i) for i in range(n)]


@pytest.mark.parametrize(("mode", "interval"), [("exact", 1), ("sample", 512), ("sample", 65536)])
@pytest.mark.parametrize(("key_type", "cumulative"), KEYS)
def test_statistics_and_compare_match_the_reference(
    core: ModuleType, mode: str, interval: int, key_type: str, cumulative: bool
) -> None:
    core.start(6, mode, interval)
    first = _workload(3000)
    old = core.take_snapshot()
    second = _workload(2000)
    del first[:1000]
    new = core.take_snapshot()
    core.stop()

    old_ref = reference.group(old.traces(), key_type, cumulative, mode, interval)
    new_ref = reference.group(new.traces(), key_type, cumulative, mode, interval)
    old_groups = old.group(key_type, cumulative)
    new_groups = new.group(key_type, cumulative)

    assert new_groups.statistics() == reference.statistics(new_ref)
    assert new_groups.compare(old_groups) == reference.compare(new_ref, old_ref)
    assert new_groups.statistics(5) == reference.statistics(new_ref)[:5]
    growth = {row[0]: row for row in new_groups.compare(old_groups)}
    for row in new_groups.growth(old_groups, 10):
        assert row == growth[row[0]]
    if not cumulative:
        assert new_groups.total[0] == sum(size for size, _ in new_ref.values()) == new.traced
    del second


def test_mask_keeps_only_chosen_tracebacks(core: ModuleType) -> None:
    core.start(3)
    data = _workload(500)
    snapshot = core.take_snapshot()
    infos = snapshot.tracebacks()
    mask = bytes(1 if frames[0][1] % 2 else 0 for _d, frames, _t, _s, _c in infos)
    kept = snapshot.traces(mask)
    assert all(frames[0][1] % 2 for _d, _s, frames, _t in kept)
    expected = reference.statistics(reference.group(kept, "lineno", False))
    assert snapshot.group("lineno", mask=mask).statistics() == expected
    with pytest.raises(ValueError, match="one byte per traceback"):
        snapshot.group("lineno", mask=b"\x01")
    del data


def test_bad_key_types_are_refused(core: ModuleType) -> None:
    core.start()
    snapshot = core.take_snapshot()
    with pytest.raises(ValueError, match="unknown key_type: 'line'"):
        snapshot.group("line")
    with pytest.raises(
        ValueError, match="cumulative mode cannot by used with key type 'traceback'"
    ):
        snapshot.group("traceback", True)
