"""``heapwatch run [options] -- COMMAND``: runs a command with the agent on,
like ``opentelemetry-instrument``: the settings become ``HEAPWATCH_*``
variables of its environment, then COMMAND replaces this process."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import TYPE_CHECKING, Callable

from heapwatch.agent.config import (
    DEFAULT_DUMP_AT,
    DEFAULT_NFRAME,
    AgentConfig,
    ConfigError,
    to_environ,
)

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = ["add_parser", "run_environment"]


def _setting(name: str) -> Callable[[str], str]:
    """An argparse type that checks a value as the agent would, and keeps its text."""

    def check(text: str) -> str:
        try:
            AgentConfig().replace(**{name: text})
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    check.__name__ = name  # argparse names the type in its errors
    return check


_RUN_OPTIONS = (
    ("mode", "sample (estimates, the default) or exact"),
    ("sample_interval", "mean bytes between samples, such as 512KiB (sample mode)"),
    (
        "nframe",
        "frames kept per traceback (default: "
        + ", ".join(f"{depth} in {mode} mode" for mode, depth in DEFAULT_NFRAME.items())
        + ")",
    ),
    ("interval", "seconds between cycles, such as 10 or 500ms (default 10s)"),
    ("top", "allocation sites with their own series (default 20)"),
    (
        "exporters",
        "prometheus, otlp, pyroscope, otlp-profiles (comma-separated) or none (default prometheus)",
    ),
    ("host", "where /metrics listens (default 127.0.0.1)"),
    ("port", "first port tried (default 9438; 0 for any free port)"),
    ("port_range", "ports tried from --port on, one per process (default 32)"),
    ("dump_dir", "where the dump signal writes dumps (default: none, the signal is off)"),
    ("dump_signal", "the signal that writes a dump, such as SIGUSR2 (the default), or none"),
    ("dump_keep", "dumps kept in --dump-dir, the oldest deleted (default 10; 0: no limit)"),
    ("dump_max_bytes", "bytes of dumps kept in --dump-dir, such as 1GiB (default 0: no limit)"),
    (
        "dump_at",
        "the black box's thresholds: a dump into --dump-dir when the container's working set "
        "crosses one, as percentages of its memory limit or sizes (default "
        + ",".join(DEFAULT_DUMP_AT).replace("%", "%%")  # (argparse formats help with %)
        + "), or none",
    ),
    (
        "termination_log",
        "where the black box's summary goes (default auto: /dev/termination-log when it exists "
        "and is writable), or none",
    ),
)


def add_parser(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a Python command with the heapwatch agent on",
        description=(
            "Runs COMMAND with HEAPWATCH_ENABLED=1 and the given settings in its "
            "environment, like opentelemetry-instrument: the Python interpreters it "
            "starts (with heapwatch installed) start the agent.  Each process serves "
            "/metrics on the first free port from --port on."
        ),
        usage="%(prog)s [options] -- COMMAND [ARGS...]",
    )
    for name, text in _RUN_OPTIONS:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            metavar=name.upper(),
            type=_setting(name),
            help=f"{text}; sets HEAPWATCH_{name.upper()}",
        )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run")
    parser.set_defaults(func=_run)


def run_environment(options: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """``base`` with HEAPWATCH_ENABLED=1 and the options given."""
    env = dict(base)
    env["HEAPWATCH_ENABLED"] = "1"
    given = {name: getattr(options, name) for name, _ in _RUN_OPTIONS}
    given = {name: value for name, value in given.items() if value is not None}
    if given:
        config = AgentConfig().replace(**given)
        variables = to_environ(config)
        for name in given:
            variable = "HEAPWATCH_" + name.upper()
            env[variable] = variables[variable]
    return env


def _run(options: argparse.Namespace) -> int:
    command: list[str] = list(options.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        options.parser.error("run: a COMMAND to run is required (heapwatch run -- COMMAND...)")
    env = run_environment(options, dict(os.environ))
    executable = shutil.which(command[0], path=env.get("PATH")) or command[0]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(executable, command, env)
    except FileNotFoundError:
        print(f"heapwatch run: {command[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"heapwatch run: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return 0  # pragma: no cover - execve does not return
