"""The agent's configuration: parsing, environment fallbacks, values from code."""

from __future__ import annotations

import ast
import builtins
import logging
from pathlib import Path
from typing import Any

import pytest

from heapwatch import HeapwatchError
from heapwatch.agent import autostart as _autostart
from heapwatch.agent import config as _config
from heapwatch.agent.config import (
    DEFAULTS,
    AgentConfig,
    ConfigError,
    parse_bool,
    parse_duration,
    parse_size,
    to_environ,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("524288", 524288),
        ("512KiB", 512 * 1024),
        ("512 KiB", 512 * 1024),
        ("512kib", 512 * 1024),
        ("1MiB", 1 << 20),
        ("1.5MB", 1_500_000),
        ("64k", 65536),
        ("2K", 2048),
        ("1GiB", 1 << 30),
        ("10B", 10),
        ("1e3", 1000),
    ],
)
def test_sizes_accept_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "KiB", "abc", "0", "-1KiB", "2TiB", "1.5parsecs", "nan"])
def test_sizes_refuse_nonsense_and_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="such as 524288, 512KiB"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10", 10.0), ("10s", 10.0), ("500ms", 0.5), ("1m", 60.0), ("1.5min", 90.0), ("1h", 3600.0)],
)
def test_durations_accept_units(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "1ms", "2d", "ten", "inf", "nan", "90000"])
def test_durations_refuse_out_of_range_and_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match=r"a duration from 0\.05s to 86400s"):
        parse_duration(text)


@pytest.mark.parametrize("word", ["1", "true", "TRUE", "yes", "on", " y "])
def test_true_words(word: str) -> None:
    assert parse_bool(word) is True


@pytest.mark.parametrize("word", ["0", "false", "No", "off", "n"])
def test_false_words(word: str) -> None:
    assert parse_bool(word) is False


def test_autostart_knows_the_same_false_words_as_the_parser() -> None:
    # _autostart recognises "off" without importing _config; the two must agree.
    assert set(_autostart._FALSE_WORDS) - {""} == set(_config._FALSE_WORDS)


# Installed, the hook sits at the root of site-packages beside the package;
# in the source tree, in agent/ beside agent/heapwatch.
PTH = Path(_config.__file__).resolve().parents[2] / "heapwatch-autostart.pth"


def _imported_by_the_pth_line(monkeypatch: pytest.MonkeyPatch, value: str | None) -> list[str]:
    """What the .pth line imports (besides os) with HEAPWATCH_ENABLED=value."""
    if value is None:
        monkeypatch.delenv("HEAPWATCH_ENABLED", raising=False)
    else:
        monkeypatch.setenv("HEAPWATCH_ENABLED", value)
    imported: list[str] = []

    def recording_import(name: str, *args: Any, **kwargs: Any) -> Any:
        imported.append(name)
        return builtins.__import__(name, *args, **kwargs) if name in ("os", "sys") else None

    exec(PTH.read_text(), {"__builtins__": {**vars(builtins), "__import__": recording_import}})
    return [name for name in imported if name not in ("os", "sys")]


def test_the_pth_hook_is_one_import_line_with_the_same_false_words() -> None:
    # site.py runs a .pth line only if it starts with "import"; the line
    # recognises "off" without importing anything, like _autostart.
    lines = PTH.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import ")
    (compare,) = [node for node in ast.walk(ast.parse(lines[0])) if isinstance(node, ast.Compare)]
    assert set(ast.literal_eval(compare.comparators[0])) == set(_autostart._FALSE_WORDS)


@pytest.mark.parametrize("value", [None, "", "  ", *sorted(_config._FALSE_WORDS), "OFF", " False "])
def test_the_pth_hook_imports_nothing_when_unset_or_false(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    assert _imported_by_the_pth_line(monkeypatch, value) == []


@pytest.mark.parametrize("value", [*sorted(_config._TRUE_WORDS), "TRUE", " on ", "maybe"])
def test_the_pth_hook_starts_autostart_for_true_and_unrecognised_values(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # An unrecognised value reaches _autostart, whose configuration warns about it.
    assert _imported_by_the_pth_line(monkeypatch, value) == ["_heapwatch_pth"]


def test_defaults_are_the_documented_ones() -> None:
    assert AgentConfig.from_env({}) == DEFAULTS
    assert DEFAULTS.enabled is True
    assert DEFAULTS.mode == "sample"
    assert DEFAULTS.sample_interval == 512 * 1024
    assert DEFAULTS.nframe is None  # the mode's: DEFAULT_NFRAME
    assert DEFAULTS.effective_nframe == 64
    assert DEFAULTS.interval == 10.0
    assert DEFAULTS.top == 20
    assert DEFAULTS.top_routes == 10
    assert DEFAULTS.exporters == ("prometheus",)
    assert DEFAULTS.host == "127.0.0.1"
    assert DEFAULTS.port == 9438
    assert DEFAULTS.port_range == 32


def test_every_variable_is_read_from_the_environment() -> None:
    env = {
        "HEAPWATCH_ENABLED": "yes",
        "HEAPWATCH_MODE": "exact",
        "HEAPWATCH_SAMPLE_INTERVAL": "64KiB",
        "HEAPWATCH_NFRAME": "5",
        "HEAPWATCH_INTERVAL": "500ms",
        "HEAPWATCH_TOP": "3",
        "HEAPWATCH_TOP_ROUTES": "0",
        "HEAPWATCH_EXPORTERS": "otlp, prometheus",
        "HEAPWATCH_HOST": "0.0.0.0",
        "HEAPWATCH_PORT": "9500",
        "HEAPWATCH_PORT_RANGE": "4",
    }
    assert AgentConfig.from_env(env) == AgentConfig(
        enabled=True,
        mode="exact",
        sample_interval=65536,
        nframe=5,
        interval=0.5,
        top=3,
        top_routes=0,
        exporters=("otlp", "prometheus"),
        host="0.0.0.0",
        port=9500,
        port_range=4,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("none", ()), ("PROMETHEUS", ("prometheus",)), ("prometheus,prometheus", ("prometheus",))],
)
def test_exporter_lists(text: str, expected: tuple[str, ...]) -> None:
    assert AgentConfig.from_env({"HEAPWATCH_EXPORTERS": text}).exporters == expected


def test_empty_variables_count_as_unset(caplog: pytest.LogCaptureFixture) -> None:
    env = {"HEAPWATCH_INTERVAL": "", "HEAPWATCH_PORT": "  "}
    assert AgentConfig.from_env(env) == DEFAULTS
    assert not caplog.records


BAD_VALUES = [
    ("HEAPWATCH_MODE", "fast", "'sample'", "mode", "sample"),
    ("HEAPWATCH_SAMPLE_INTERVAL", "lots", "512KiB", "sample_interval", 512 * 1024),
    ("HEAPWATCH_SAMPLE_INTERVAL", "0", "from 1 to", "sample_interval", 512 * 1024),
    ("HEAPWATCH_NFRAME", "0", "from 1 to 65535", "nframe", None),
    ("HEAPWATCH_NFRAME", "two", "from 1 to 65535", "nframe", None),
    ("HEAPWATCH_INTERVAL", "soon", "10s, 500ms", "interval", 10.0),
    ("HEAPWATCH_INTERVAL", "0", "10s, 500ms", "interval", 10.0),
    ("HEAPWATCH_TOP", "-1", "from 0 to 1000", "top", 20),
    ("HEAPWATCH_TOP_ROUTES", "many", "from 0 to 1000", "top_routes", 10),
    (
        "HEAPWATCH_EXPORTERS",
        "zipkin",
        "prometheus, otlp, pyroscope and otlp-profiles, or none",
        "exporters",
        ("prometheus",),
    ),
    (
        "HEAPWATCH_EXPORTERS",
        "none,otlp",
        "prometheus, otlp, pyroscope and otlp-profiles, or none",
        "exporters",
        ("prometheus",),
    ),
    ("HEAPWATCH_HOST", "local host", "127.0.0.1, 0.0.0.0", "host", "127.0.0.1"),
    ("HEAPWATCH_PORT", "70000", "from 0 to 65535", "port", 9438),
    ("HEAPWATCH_PORT", "http", "from 0 to 65535", "port", 9438),
    ("HEAPWATCH_PORT_RANGE", "0", "from 1 to 1024", "port_range", 32),
    ("HEAPWATCH_LEAK_WINDOW", "5s", "from 10s to 86400s", "leak_window", 1800.0),
    ("HEAPWATCH_LEAK_WINDOW", "forever", "such as 30m, 2h or 10s", "leak_window", 1800.0),
]


def test_the_leak_window_is_a_duration_from_ten_seconds_to_a_day() -> None:
    assert AgentConfig().leak_window == 1800.0
    assert AgentConfig.from_env({"HEAPWATCH_LEAK_WINDOW": "10s"}).leak_window == 10.0
    assert AgentConfig.from_env({"HEAPWATCH_LEAK_WINDOW": "2h"}).leak_window == 7200.0
    assert AgentConfig().replace(leak_window=60).leak_window == 60.0
    assert AgentConfig().replace(leak_window="30m").leak_window == 1800.0
    with pytest.raises(HeapwatchError, match=r"leak_window=9\.5 is invalid"):
        AgentConfig().replace(leak_window=9.5)


@pytest.mark.parametrize(("variable", "text", "accepted", "name", "default"), BAD_VALUES)
def test_a_bad_environment_value_warns_and_the_default_applies(  # noqa: PLR0917
    caplog: pytest.LogCaptureFixture,
    variable: str,
    text: str,
    accepted: str,
    name: str,
    default: object,
) -> None:
    # Given a bad value next to a good one
    env = {variable: text, "HEAPWATCH_TOP": "7"} if name != "top" else {variable: text}
    # When the configuration is read
    with caplog.at_level(logging.WARNING, logger="heapwatch.config"):
        config = AgentConfig.from_env(env)
    # Then one warning names the variable, the value and what is accepted
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert variable in message
    assert repr(text) in message
    assert accepted in message
    # and the default applies, the other settings being kept
    assert getattr(config, name) == default
    if name != "top":
        assert config.top == 7


def test_a_bad_enabled_value_warns_and_switches_heapwatch_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="heapwatch.config"):
        config = AgentConfig.from_env({"HEAPWATCH_ENABLED": "maybe"})
    assert config.enabled is False
    message = caplog.records[0].getMessage()
    assert "HEAPWATCH_ENABLED='maybe'" in message
    assert "true/false, 1/0, yes/no or on/off" in message
    assert "using false" in message


def test_code_values_override_the_environment() -> None:
    config = AgentConfig.from_env(
        {"HEAPWATCH_INTERVAL": "30", "HEAPWATCH_TOP": "5"}, interval=2, sample_interval="1MiB"
    )
    assert config.interval == 2.0
    assert config.sample_interval == 1 << 20
    assert config.top == 5


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("interval", 0, "interval=0 is invalid: expected a duration"),
        ("top", "many", "top='many' is invalid"),
        ("port", True, "port must not be a bool"),
        ("exporters", ["prometheus", "statsd"], "exporters="),
        ("mode", 3.5, "wrong type"),
        ("colour", "blue", "unknown heapwatch setting 'colour'"),
    ],
)
def test_bad_values_in_code_raise_a_config_error(name: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        DEFAULTS.replace(**{name: value})
    assert isinstance(info.value, HeapwatchError)
    assert isinstance(info.value, ValueError)


def test_code_values_accept_python_types() -> None:
    config = DEFAULTS.replace(
        enabled=False, interval=0.25, exporters=["otlp"], port=0, sample_interval=4096
    )
    assert config.enabled is False
    assert config.interval == 0.25
    assert config.exporters == ("otlp",)
    assert config.port == 0
    assert config.sample_interval == 4096
    assert DEFAULTS.replace(exporters=[]).exporters == ()


def test_exact_mode_reports_no_sample_interval() -> None:
    assert DEFAULTS.reported_sample_interval == 512 * 1024
    assert DEFAULTS.replace(mode="exact").reported_sample_interval == 0


def test_to_environ_round_trips() -> None:
    config = AgentConfig(mode="exact", interval=0.3, exporters=(), port=0, top=0)
    assert AgentConfig.from_env(to_environ(config)) == config


@pytest.mark.parametrize(
    ("env", "code", "expected"),
    [
        ({}, {}, 64),
        ({"HEAPWATCH_MODE": "sample"}, {}, 64),
        ({"HEAPWATCH_MODE": "exact"}, {}, 1),
        ({}, {"mode": "exact"}, 1),
        ({"HEAPWATCH_MODE": "sample", "HEAPWATCH_NFRAME": "1"}, {}, 1),
        ({"HEAPWATCH_MODE": "exact", "HEAPWATCH_NFRAME": "25"}, {}, 25),
        ({"HEAPWATCH_NFRAME": "5"}, {"mode": "exact"}, 5),
        ({"HEAPWATCH_NFRAME": "5"}, {"nframe": 7}, 7),
        ({"HEAPWATCH_NFRAME": "5"}, {"nframe": None}, 64),
    ],
)
def test_the_default_nframe_depends_on_the_mode_and_an_explicit_one_wins(
    env: dict[str, str], code: dict[str, Any], expected: int
) -> None:
    assert AgentConfig.from_env(env, **code).effective_nframe == expected


def test_a_bad_nframe_falls_back_to_the_modes_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="heapwatch.config"):
        config = AgentConfig.from_env({"HEAPWATCH_NFRAME": "deep", "HEAPWATCH_MODE": "exact"})
    assert config.effective_nframe == 1
    (record,) = caplog.records
    assert "using the mode's default, exact 1, sample 64" in record.getMessage()


@pytest.mark.parametrize("nframe", [None, 5])
@pytest.mark.parametrize("mode", ["exact", "sample"])
def test_to_environ_keeps_the_nframe_default_by_mode(mode: str, nframe: int | None) -> None:
    config = AgentConfig(mode=mode, nframe=nframe)
    env = to_environ(config)
    assert ("HEAPWATCH_NFRAME" in env) == (nframe is not None)
    assert AgentConfig.from_env(env) == config


def test_nframe_is_bounded_by_the_cores_limit(caplog: pytest.LogCaptureFixture) -> None:
    from heapwatch import _core

    highest = _core.MAX_NFRAME
    assert AgentConfig.from_env({"HEAPWATCH_NFRAME": str(highest)}).nframe == highest
    with caplog.at_level(logging.WARNING, logger="heapwatch.config"):
        AgentConfig.from_env({"HEAPWATCH_NFRAME": str(highest + 1)})
    (record,) = caplog.records
    assert f"an integer from 1 to {highest}" in record.getMessage()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90%,97%", (_config.Threshold(percent=90.0), _config.Threshold(percent=97.0))),
        (" 80 % ", (_config.Threshold(percent=80.0),)),
        ("99.5%, 1.5GiB", (_config.Threshold(percent=99.5), _config.Threshold(size=3 << 29))),
        ("100%", (_config.Threshold(percent=100.0),)),
        ("none", ()),
        ("OFF", ()),
    ],
)
def test_black_box_thresholds_are_percentages_or_sizes(
    text: str, expected: tuple[Any, ...]
) -> None:
    assert _config.parse_dump_at(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("120%", "'120%' is above 100%"),
        ("0%", "'0%' is not above 0%"),
        ("-5%", "'-5%' is not above 0%"),
        ("nan%", "'nan%' is not a number of percent"),
        ("90%,lots", "'lots' is neither a percentage nor a size"),
        (",", "like 90%,97%; or none"),
    ],
)
def test_a_bad_threshold_is_named_in_the_error(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"dump_at={text!r} is invalid: expected .*{why}"):
        AgentConfig().replace(dump_at=text)


def test_black_box_settings_from_the_environment(caplog: pytest.LogCaptureFixture) -> None:
    assert DEFAULTS.dump_at == _config.parse_dump_at(",".join(_config.DEFAULT_DUMP_AT))
    assert DEFAULTS.termination_log == _config.TERMINATION_LOG_AUTO
    config = AgentConfig.from_env(
        {"HEAPWATCH_DUMP_AT": "none", "HEAPWATCH_TERMINATION_LOG": "/var/log/why"}
    )
    assert (config.dump_at, config.termination_log) == ((), "/var/log/why")
    assert AgentConfig.from_env({"HEAPWATCH_TERMINATION_LOG": "none"}).termination_log is None
    with caplog.at_level(logging.WARNING, "heapwatch.config"):
        config = AgentConfig.from_env({"HEAPWATCH_DUMP_AT": "150%"})
    assert config.dump_at == DEFAULTS.dump_at
    assert "HEAPWATCH_DUMP_AT='150%' is invalid" in caplog.text
    assert "'150%' is above 100%; using 90%,97%" in caplog.text


def test_black_box_settings_round_trip_through_the_environment() -> None:
    for config in (
        AgentConfig().replace(dump_at="33.3%,2GiB", termination_log=None),
        AgentConfig().replace(dump_at="none", termination_log="auto"),
        AgentConfig().replace(dump_at=["95%"], termination_log="/tmp/t"),
    ):
        assert AgentConfig.from_env(to_environ(config)) == config
