"""The dump settings: HEAPWATCH_TOKEN, HEAPWATCH_DUMP_SIGNAL, _DIR, _KEEP, _MAX_BYTES."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from heapwatch.agent.agent import Agent
from heapwatch.agent.config import DEFAULTS, AgentConfig, ConfigError, to_environ
from heapwatch.cli import build_parser
from heapwatch.cli.run import run_environment

TOKEN = "s3cret-token-0123456789"


def test_the_defaults_leave_debug_closed_and_the_signal_off() -> None:
    assert DEFAULTS.token is None
    assert DEFAULTS.dump_signal == "SIGUSR2"
    assert DEFAULTS.dump_dir is None
    assert DEFAULTS.dump_keep == 10
    assert DEFAULTS.dump_max_bytes == 0


def test_every_dump_variable_is_read_from_the_environment(tmp_path: os.PathLike[str]) -> None:
    env = {
        "HEAPWATCH_TOKEN": f" {TOKEN} ",
        "HEAPWATCH_DUMP_SIGNAL": "usr1",
        "HEAPWATCH_DUMP_DIR": str(tmp_path),
        "HEAPWATCH_DUMP_KEEP": "3",
        "HEAPWATCH_DUMP_MAX_BYTES": "1.5MiB",
    }
    config = AgentConfig.from_env(env)
    assert config.token == TOKEN
    assert config.dump_signal == "SIGUSR1"
    assert config.dump_dir == str(tmp_path)
    assert config.dump_keep == 3
    assert config.dump_max_bytes == 1536 * 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [("SIGUSR2", "SIGUSR2"), ("USR2", "SIGUSR2"), ("sighup", "SIGHUP"), ("none", None)],
)
def test_signals_are_named_with_or_without_sig(text: str, expected: str | None) -> None:
    assert AgentConfig.from_env({"HEAPWATCH_DUMP_SIGNAL": text}).dump_signal == expected


def test_a_relative_dump_dir_is_made_absolute_when_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    config = AgentConfig.from_env({"HEAPWATCH_DUMP_DIR": "dumps"})
    assert config.dump_dir == os.path.join(str(tmp_path), "dumps")


@pytest.mark.parametrize(
    ("variable", "text", "accepted", "fallback"),
    [
        ("HEAPWATCH_DUMP_SIGNAL", "SIGTERM", "a signal name: SIGUSR1, SIGUSR2", "SIGUSR2"),
        ("HEAPWATCH_DUMP_SIGNAL", "SIGKILL", "or none", "SIGUSR2"),
        ("HEAPWATCH_DUMP_KEEP", "-1", "dumps kept, 0 for no limit", 10),
        ("HEAPWATCH_DUMP_MAX_BYTES", "lots", "0 for no limit", 0),
        ("HEAPWATCH_DUMP_DIR", "a\0b", "a directory", None),
    ],
)
def test_bad_dump_values_warn_and_fall_back(
    caplog: pytest.LogCaptureFixture, variable: str, text: str, accepted: str, fallback: object
) -> None:
    with caplog.at_level(logging.WARNING, logger="heapwatch.config"):
        config = AgentConfig.from_env({variable: text})
    field = variable.removeprefix("HEAPWATCH_").lower()
    assert getattr(config, field) == fallback
    (record,) = caplog.records
    assert variable in record.getMessage()
    assert accepted in record.getMessage()


@pytest.mark.parametrize("token", ["short", "has space inside it!!", "é" * 20, "=" * 20])
def test_a_bad_token_warns_without_showing_it_and_leaves_debug_closed(
    caplog: pytest.LogCaptureFixture, token: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="heapwatch.config"):
        config = AgentConfig.from_env({"HEAPWATCH_TOKEN": token})
    assert config.token is None
    (record,) = caplog.records
    message = record.getMessage()
    assert "HEAPWATCH_TOKEN" in message
    assert "a bearer token of 16 to 4096 characters" in message
    assert token not in message


def test_the_token_is_never_shown() -> None:
    config = DEFAULTS.replace(token=TOKEN)
    assert TOKEN not in repr(config)
    assert "token='<redacted>'" in repr(config)
    assert "token=None" in repr(DEFAULTS)
    with pytest.raises(ConfigError) as info:
        DEFAULTS.replace(token="bad token")
    assert "bad token" not in str(info.value)
    assert "token=<redacted> is invalid" in str(info.value)


def test_code_values_take_python_types_and_none() -> None:
    config = DEFAULTS.replace(
        token=TOKEN, dump_signal=signal.SIGUSR1, dump_dir="/tmp/d", dump_keep=0, dump_max_bytes=1
    )
    assert (config.dump_signal, config.dump_dir, config.dump_keep) == ("SIGUSR1", "/tmp/d", 0)
    config = config.replace(token=None, dump_signal=None, dump_dir=None)
    assert (config.token, config.dump_signal, config.dump_dir) == (None, None, None)
    with pytest.raises(ConfigError, match="dump_signal='SIGINT' is invalid"):
        DEFAULTS.replace(dump_signal="SIGINT")


def test_to_environ_round_trips_the_dump_settings() -> None:
    for config in (
        DEFAULTS,
        DEFAULTS.replace(dump_signal=None),
        DEFAULTS.replace(
            token=TOKEN, dump_dir="/var/dumps", dump_signal="SIGHUP", dump_max_bytes=10
        ),
    ):
        env = to_environ(config)
        assert "None" not in env.values()
        assert AgentConfig.from_env(env) == config


def test_heapwatch_run_passes_dump_settings_but_takes_no_token() -> None:
    parser = build_parser()
    options = parser.parse_args(
        ["run", "--dump-dir", "/tmp/dumps", "--dump-keep", "2", "--", "python", "app.py"]
    )
    env = run_environment(options, {})
    assert env["HEAPWATCH_DUMP_DIR"] == "/tmp/dumps"
    assert env["HEAPWATCH_DUMP_KEEP"] == "2"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--token", TOKEN, "--", "python"])


def test_the_agents_router_takes_the_token() -> None:
    assert Agent(DEFAULTS.replace(token=TOKEN), exporters=[]).router.token == TOKEN
    assert Agent(DEFAULTS, exporters=[]).router.token is None
