"""The soak's checks of the tracer's own memory (tests/soak/soak.py) judge
the run against its steady state, not against a first scrape taken while
the service's threads were still filling their pools."""

from __future__ import annotations

from pathlib import Path

from support.repo_scripts import load_script

soak = load_script(Path(__file__).resolve().parents[1] / "soak" / "soak.py", "soak_run")

MIB = 2**20


def scrapes(first: float, steady: float, seconds: int = 60) -> list[tuple[float, float]]:
    """A scrape a second: the first while the pools fill, then steady."""
    return [(0.0, first)] + [(float(t), steady) for t in range(1, seconds + 1)]


def memory_problems(samples: list[tuple[float, float]], end: float) -> list[str]:
    result = {"heapwatch_bytes": 0, "heapwatch_top": [], "tracer_memory": end}
    problems: list[str] = soak._flat(samples) + soak._heapwatch_memory(result, samples)
    return problems


def test_a_first_scrape_during_warm_up_is_not_the_reference() -> None:
    # A CI run: 0.05 MiB at the first scrape, 0.57 MiB steady, 0.18 MiB at
    # the end once the threads had stopped and freed their pools.
    assert memory_problems(scrapes(0.05 * MIB, 0.57 * MIB), 0.18 * MIB) == []


def test_the_end_far_above_the_steady_state_is_reported() -> None:
    # Before heapwatch's threads went untraced: 16.2 MiB steady, 42.1 MiB
    # at the end (a dump's objects traced as the service's).
    problems = memory_problems(scrapes(10.2 * MIB, 16.2 * MIB), 42.1 * MIB)
    assert len(problems) == 1 and "steady state" in problems[0], problems


def test_a_floor_that_rises_in_the_last_quarter_is_reported() -> None:
    samples = scrapes(0.3 * MIB, 0.5 * MIB)
    samples = [(t, v * 1.2 if t >= 45 else v) for t, v in samples]
    problems = memory_problems(samples, 0.2 * MIB)
    assert len(problems) == 1 and "grew" in problems[0], problems


def test_too_few_scrapes_are_reported() -> None:
    assert memory_problems(scrapes(MIB, MIB, seconds=3), MIB) == [
        "only 4 scrapes of the tracer's memory"
    ]
