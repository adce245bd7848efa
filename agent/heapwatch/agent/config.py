"""The agent's configuration: from code or from ``HEAPWATCH_*`` variables, same names.

A value given in code is checked strictly (``ConfigError`` names the parameter
and what it accepts).  A value read from the environment never stops the
service: a bad one is logged as a warning on the ``heapwatch.config`` logger,
naming the variable, the value and what is accepted, and the default applies,
as the OpenTelemetry SDK does with its ``OTEL_*`` variables.  Warnings go
through ``logging`` rather than ``warnings``: ``python -W error`` must not turn
a typo in the environment into a failure to start.

This module is imported on the auto-start path: it imports only ``os`` at
module level.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, NamedTuple

from heapwatch._errors import HeapwatchError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Callable, TypeVar

    T = TypeVar("T")

__all__ = [
    "DEFAULTS",
    "DEFAULT_DUMP_AT",
    "DEFAULT_NFRAME",
    "EXPORTER_NAMES",
    "TERMINATION_LOG_AUTO",
    "TERMINATION_LOG_DEFAULT",
    "AgentConfig",
    "ConfigError",
    "Threshold",
    "parse_age",
    "parse_bool",
    "parse_dump_at",
    "parse_duration",
    "parse_leak_window",
    "parse_size",
]

ENV_PREFIX = "HEAPWATCH_"
EXPORTER_NAMES = ("prometheus", "otlp", "pyroscope", "otlp-profiles")
MIN_INTERVAL = 0.05
MAX_INTERVAL = 86400.0
# The leak score's sliding window: down to 10 s so that tests can compress
# time; up to a day, as the agent keeps every observed site's series over it.
MIN_LEAK_WINDOW = 10.0
MAX_LEAK_WINDOW = 86400.0
# The oldest age one may ask for (``heapwatch top --min-age``, ``min_age=``):
# a year, far beyond any service's uptime between deploys.
MAX_AGE = 365 * 86400.0
MAX_TOP = 1000
# Frames kept per traceback unless HEAPWATCH_NFRAME says, by mode.  Exact mode
# walks the stack at every allocation, so it keeps one frame (the line, as
# the stdlib's default); sample mode walks it only for the sampled ones (one
# per 512 KiB by default), so it can afford the callers, as ddtrace does (64).
# Cost: docs/design/agent.md ("Configuration").
DEFAULT_NFRAME = {"exact": 1, "sample": 64}
MAX_PORT_RANGE = 1024
MAX_DUMP_KEEP = 100_000
MAX_DUMP_BYTES = 1 << 50  # 1 PiB: "no real limit" without overflowing anything
MIN_TOKEN_LENGTH = 16
MAX_TOKEN_LENGTH = 4096
# Signals a dump may be asked with: catchable, and with no meaning a service
# relies on by default (not INT, TERM, CHLD, the fault signals, KILL, STOP).
DUMP_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGWINCH")

# The black box's thresholds unless HEAPWATCH_DUMP_AT says: docs/design/dumps.md
# ("The black box") has the measurements behind them.  90% leaves the time a
# dump of a million exact-mode traces takes at the fastest growth a container
# survives for a second; 97% is the last picture, taken when the kill is near.
DEFAULT_DUMP_AT = ("90%", "97%")
# HEAPWATCH_TERMINATION_LOG's default: Kubernetes' file, when it exists and is
# writable (the kubelet shows it as the last state's message).
TERMINATION_LOG_AUTO = "auto"
TERMINATION_LOG_DEFAULT = "/dev/termination-log"

_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off", "n", "f"})
_BOOL_ACCEPTED = "true/false, 1/0, yes/no or on/off"

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


class ConfigError(HeapwatchError, ValueError):
    """A configuration value given in code is invalid."""


def parse_bool(text: str) -> bool:
    """``true/false``, ``1/0``, ``yes/no``, ``on/off`` (any case)."""
    word = text.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise ValueError(_BOOL_ACCEPTED)


def _split_number(text: str) -> tuple[float, str]:
    stripped = text.strip()
    end = len(stripped)
    while end > 0 and stripped[end - 1].isalpha():
        end -= 1
    number, unit = stripped[:end].strip(), stripped[end:].lower()
    return float(number), unit


def _max_nframe() -> int:
    # The core's bound, its one home (imported when checked: see below).
    from heapwatch import _core  # noqa: PLC0415

    return _core.MAX_NFRAME


def _max_sample_interval() -> int:
    # The core's bound, its one home.  Imported when a size is checked, not
    # with this module: the auto-start hook imports this module before it
    # knows whether to start, and importing the core registers its exit hook.
    from heapwatch import _core  # noqa: PLC0415

    return _core.MAX_SAMPLE_INTERVAL


def _bytes_in(text: str, lowest: int, highest: int, accepted: str) -> int:
    """Bytes from ``text`` with an optional unit, in [lowest; highest];
    ValueError(accepted) otherwise."""
    try:
        number, unit = _split_number(text)
    except ValueError:
        raise ValueError(accepted) from None
    if unit not in _SIZE_UNITS or math.isnan(number):
        raise ValueError(accepted)
    size = round(number * _SIZE_UNITS[unit])
    if not lowest <= size <= highest:
        raise ValueError(accepted)
    return size


def parse_size(text: str) -> int:
    """Bytes from ``524288``, ``512KiB``, ``1MiB``, ``1.5MB`` (K/M/G alone are binary)."""
    limit = _max_sample_interval()
    accepted = (
        f"a size in bytes from 1 to {limit} ({limit / (1 << 40):g} TiB), "
        "such as 524288, 512KiB, 1MiB or 1.5MB"
    )
    return _bytes_in(text, 1, limit, accepted)


def _seconds_in(text: str, lowest: float, highest: float, accepted: str) -> float:
    """Seconds from ``text`` with an optional unit, in [lowest; highest];
    ValueError(accepted) otherwise."""
    try:
        number, unit = _split_number(text)
    except ValueError:
        raise ValueError(accepted) from None
    if unit not in _DURATION_UNITS:
        raise ValueError(accepted)
    seconds = number * _DURATION_UNITS[unit]
    if not lowest <= seconds <= highest:  # also refuses NaN
        raise ValueError(accepted)
    return seconds


def parse_duration(text: str) -> float:
    """Seconds from ``10``, ``10s``, ``500ms``, ``1.5m``, ``1h``."""
    accepted = (
        f"a duration from {MIN_INTERVAL:g}s to {MAX_INTERVAL:g}s, such as 10, 10s, 500ms, 1m or 1h"
    )
    return _seconds_in(text, MIN_INTERVAL, MAX_INTERVAL, accepted)


def parse_age(text: str) -> float:
    """Seconds of age from ``0``, ``90s``, ``30m``, ``2h``: how old live
    memory must be to be selected (not a setting of the agent)."""
    accepted = "a duration from 0s to 8760h (365 days), such as 90s, 30m or 2h"
    return _seconds_in(text, 0.0, MAX_AGE, accepted)


def parse_leak_window(text: str) -> float:
    """Seconds of the leak score's window (``HEAPWATCH_LEAK_WINDOW``)."""
    accepted = (
        f"a duration from {MIN_LEAK_WINDOW:g}s to {MAX_LEAK_WINDOW:g}s (1 day), "
        "such as 30m, 2h or 10s"
    )
    return _seconds_in(text, MIN_LEAK_WINDOW, MAX_LEAK_WINDOW, accepted)


def _parse_int(low: int, high: int | Callable[[], int], what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        highest = high() if callable(high) else high
        accepted = f"{what}: an integer from {low} to {highest}"
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(accepted) from None
        if not low <= value <= highest:
            raise ValueError(accepted)
        return value

    return parse


def _parse_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in ("sample", "exact"):
        raise ValueError("'sample' (estimates, for production) or 'exact' (every block)")
    return mode


def _parse_exporters(text: str) -> tuple[str, ...]:
    accepted = "a comma-separated list of prometheus, otlp, pyroscope and otlp-profiles, or none"
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if names == ["none"]:
        return ()
    if not names or any(name not in EXPORTER_NAMES for name in names):
        raise ValueError(accepted)
    return tuple(dict.fromkeys(names))


def _parse_host(text: str) -> str:
    host = text.strip()
    if not host or any(c.isspace() for c in host):
        raise ValueError("an address to listen on, such as 127.0.0.1, 0.0.0.0 or ::1")
    return host


def _parse_pyroscope_url(text: str) -> str:
    from urllib.parse import urlsplit  # noqa: PLC0415 (only when one is set)

    url = text.strip().rstrip("/")
    accepted = (
        "Pyroscope's base URL, http:// or https:// with a host, such as "
        "http://pyroscope:4040 (heapwatch appends /ingest)"
    )
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise ValueError(accepted) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(accepted)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(
            "a base URL without query, fragment or credentials (credentials go in "
            "HEAPWATCH_PYROSCOPE_USER and HEAPWATCH_PYROSCOPE_PASSWORD)"
        )
    return url


def _parse_header_value(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if not value or len(value) > 256 or any(not c.isprintable() for c in value):
            raise ValueError(f"{what}: 1 to 256 printable characters")
        return value

    return parse


def _parse_token(text: str) -> str:
    token = text.strip()
    # RFC 6750's b64token: what may follow "Bearer " without quoting.
    allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/"
    body = token.rstrip("=")
    if (
        not MIN_TOKEN_LENGTH <= len(token) <= MAX_TOKEN_LENGTH
        or not body
        or any(c not in allowed for c in body)
    ):
        raise ValueError(
            f"a bearer token of {MIN_TOKEN_LENGTH} to {MAX_TOKEN_LENGTH} characters from "
            "A-Z a-z 0-9 - . _ ~ + / (then optional '='), such as the output of "
            "'openssl rand -hex 32'"
        )
    return token


def _parse_signal(text: str) -> str | None:
    name = text.strip().upper()
    if name in ("NONE", "OFF"):
        return None
    if not name.startswith("SIG"):
        name = "SIG" + name
    import signal  # noqa: PLC0415 (on the auto-start path: only when a signal is named)

    if name not in DUMP_SIGNALS or not hasattr(signal, name):
        available = [n for n in DUMP_SIGNALS if hasattr(signal, n)]
        raise ValueError(
            "a signal name: " + ", ".join(available) + " (the SIG prefix is optional), or none"
        )
    return name


def _parse_dump_dir(text: str) -> str:
    if not text.strip() or "\0" in text:
        raise ValueError("a directory to write dumps into")
    # Resolved once, now: a later chdir() of the application must not move the dumps.
    return os.path.abspath(os.path.expanduser(text))


def _parse_byte_limit(text: str) -> int:
    accepted = (
        "a size in bytes, such as 500MiB or 2GB, or 0 for no limit "
        f"(at most {MAX_DUMP_BYTES} bytes)"
    )
    return _bytes_in(text, 0, MAX_DUMP_BYTES, accepted)


class Threshold(NamedTuple):
    """A black-box threshold: a share of the container's memory limit
    (``percent``) or a working set in bytes (``size``)."""

    percent: float | None = None
    size: int | None = None

    def bytes_of(self, limit: int) -> int:
        """The working set, in bytes, at which it is crossed under ``limit``."""
        if self.percent is not None:
            return int(limit * self.percent / 100)
        return self.size if self.size is not None else limit

    def __str__(self) -> str:
        if self.percent is not None:
            shown = int(self.percent) if self.percent.is_integer() else self.percent
            return f"{shown}%"
        return f"{self.size}B"


def parse_dump_at(text: str) -> tuple[Threshold, ...]:
    """The black box's thresholds from ``90%,97%``, ``1.5GiB``, ``none``:
    percentages of the container's limit (above 0, at most 100) or sizes."""
    accepted = (
        "a comma-separated list of percentages of the container's memory limit "
        "(above 0%, at most 100%) or sizes (such as 1.5GiB), like 90%,97%; or none"
    )
    words = [word.strip() for word in text.split(",") if word.strip()]
    if [word.lower() for word in words] in (["none"], ["off"]):
        return ()
    if not words:
        raise ValueError(accepted)
    thresholds: list[Threshold] = []
    for word in words:
        if word.endswith("%"):
            try:
                percent = float(word[:-1])
            except ValueError:
                percent = math.nan
            if math.isnan(percent):
                raise ValueError(f"{accepted}; {word!r} is not a number of percent")
            if percent > 100:
                raise ValueError(f"{accepted}; {word!r} is above 100%") from None
            if percent <= 0:
                raise ValueError(f"{accepted}; {word!r} is not above 0%") from None
            thresholds.append(Threshold(percent=percent))
        else:
            try:
                size = _bytes_in(word, 1, MAX_DUMP_BYTES, accepted)
            except ValueError:
                raise ValueError(
                    f"{accepted}; {word!r} is neither a percentage nor a size"
                ) from None
            thresholds.append(Threshold(size=size))
    return tuple(dict.fromkeys(thresholds))


def _parse_termination_log(text: str) -> str | None:
    word = text.strip()
    if word.lower() in ("none", "off"):
        return None
    if word.lower() == TERMINATION_LOG_AUTO:
        return TERMINATION_LOG_AUTO
    if not word or "\0" in word:
        raise ValueError(
            f"a file to write the black box's summary to, {TERMINATION_LOG_AUTO} "
            f"({TERMINATION_LOG_DEFAULT} when it exists and is writable) or none"
        )
    return os.path.abspath(os.path.expanduser(word))


# A field's fallback when it is AgentConfig's default (its one home).
_DEFAULT: Any = object()


class _Field(NamedTuple):
    name: str
    parse: Callable[[str], Any]
    # What a bad environment value falls back to: the default, unless said.
    fallback: Any = _DEFAULT
    secret: bool = False  # never logged nor put in an error message
    # What None means, in the warning that falls back to it.
    none_means: str = "none"


# One row per setting: the parameter ``name`` is read from HEAPWATCH_<NAME>.
_FIELDS = (
    # A bad HEAPWATCH_ENABLED switches heapwatch off: only a clear yes turns it on.
    _Field("enabled", parse_bool, fallback=False),
    _Field("mode", _parse_mode),
    _Field("sample_interval", parse_size),
    _Field(
        "nframe",
        _parse_int(1, _max_nframe, "frames kept per traceback"),
        none_means="the mode's default, "
        + ", ".join(f"{mode} {depth}" for mode, depth in DEFAULT_NFRAME.items()),
    ),
    _Field("interval", parse_duration),
    _Field("top", _parse_int(0, MAX_TOP, "sites with their own series")),
    _Field("top_routes", _parse_int(0, MAX_TOP, "routes with their own series, 0 for none")),
    _Field("leak_window", parse_leak_window),
    _Field("exporters", _parse_exporters),
    _Field("host", _parse_host),
    _Field("port", _parse_int(0, 65535, "the first port tried, 0 for any free port")),
    _Field("port_range", _parse_int(1, MAX_PORT_RANGE, "how many ports to try")),
    # A bad token leaves /debug/ closed (403), never open (the default: None).
    _Field("token", _parse_token, secret=True),
    _Field("dump_signal", _parse_signal),
    _Field("dump_dir", _parse_dump_dir),
    _Field("dump_keep", _parse_int(0, MAX_DUMP_KEEP, "dumps kept, 0 for no limit")),
    _Field("dump_max_bytes", _parse_byte_limit),
    _Field("dump_at", parse_dump_at),
    _Field("termination_log", _parse_termination_log),
    # The pyroscope exporter's (HEAPWATCH_EXPORTERS=...,pyroscope).
    _Field("pyroscope_url", _parse_pyroscope_url),
    _Field("pyroscope_user", _parse_header_value("a basic-auth user, such as a Grafana Cloud id")),
    _Field(
        "pyroscope_password",
        _parse_header_value("a basic-auth password or API token"),
        secret=True,
    ),
    _Field("pyroscope_tenant_id", _parse_header_value("the X-Scope-OrgID of a tenant")),
)
# Settings that take None from code: off ("none" or unset in the environment),
# or for nframe the mode's default (unset in the environment).
_OPTIONAL = frozenset(
    {
        "nframe",
        "token",
        "dump_signal",
        "dump_dir",
        "termination_log",
        "pyroscope_url",
        "pyroscope_user",
        "pyroscope_password",
        "pyroscope_tenant_id",
    }
)
_FIELDS_BY_NAME = {field.name: field for field in _FIELDS}
# Settings in seconds: a number from code is read as seconds.
_DURATIONS = frozenset({"interval", "leak_window"})


class AgentConfig(NamedTuple):
    """What the agent does; ``AgentConfig.from_env()`` reads ``HEAPWATCH_*``.

    Attributes:
        enabled: HEAPWATCH_ENABLED; auto-start needs it true.
        mode: HEAPWATCH_MODE: ``"sample"`` (estimates, default) or ``"exact"``.
        sample_interval: HEAPWATCH_SAMPLE_INTERVAL, bytes between samples on
            average (sample mode; accepts ``512KiB``).
        nframe: HEAPWATCH_NFRAME, frames kept per traceback; None (the
            default) takes the mode's, ``DEFAULT_NFRAME[mode]``: see
            ``effective_nframe``.
        interval: HEAPWATCH_INTERVAL, seconds between cycles.
        top: HEAPWATCH_TOP, allocation sites with their own series; the
            others are summed into the ``<other>`` site.
        top_routes: HEAPWATCH_TOP_ROUTES, routes (``http.route``) with their
            own series, each with its top lines; the others are summed into
            the ``<other>`` route (0: no route series).
        leak_window: HEAPWATCH_LEAK_WINDOW, seconds of history the leak
            score of each site looks at (``30m`` by default, 10 s to a day).
        exporters: HEAPWATCH_EXPORTERS: ``prometheus``, ``otlp``, both or none.
        host: HEAPWATCH_HOST, where ``/metrics`` listens.
        port: HEAPWATCH_PORT, the first port tried (0: any free port).
        port_range: HEAPWATCH_PORT_RANGE, ports tried from ``port`` on, so
            that each process of a service (workers, children) gets its own.
        token: HEAPWATCH_TOKEN, the bearer token every ``/debug/`` route
            needs; None (the default) closes them (403).  Never shown in
            ``repr()`` or in messages.
        dump_signal: HEAPWATCH_DUMP_SIGNAL, the signal that writes a dump
            into ``dump_dir`` (``"SIGUSR2"`` by default), or None.
        dump_dir: HEAPWATCH_DUMP_DIR, where signalled dumps go (made
            absolute when read); None (the default) leaves the signal alone.
        dump_keep: HEAPWATCH_DUMP_KEEP, the most dumps kept in ``dump_dir``
            (the oldest are deleted; 0: no limit).
        dump_max_bytes: HEAPWATCH_DUMP_MAX_BYTES, the most bytes of dumps
            kept in ``dump_dir`` (0: no limit).
        dump_at: HEAPWATCH_DUMP_AT, the black box's thresholds: when the
            container's working set crosses one, a dump is written into
            ``dump_dir`` before the kernel's OOM killer acts (``90%,97%`` of
            the limit by default; ``none``, an empty tuple, switches it off).
        termination_log: HEAPWATCH_TERMINATION_LOG, where a short summary
            goes at each crossing: ``"auto"`` (the default) is
            ``/dev/termination-log`` when it exists and is writable; None
            switches it off.
        pyroscope_url: HEAPWATCH_PYROSCOPE_URL, the Pyroscope server the
            ``pyroscope`` exporter pushes each cycle's profile to
            (``<url>/ingest``).
        pyroscope_user, pyroscope_password: HEAPWATCH_PYROSCOPE_USER and
            HEAPWATCH_PYROSCOPE_PASSWORD, its basic auth (Grafana Cloud's
            instance id and an access token); the password is a secret.
        pyroscope_tenant_id: HEAPWATCH_PYROSCOPE_TENANT_ID, sent as
            ``X-Scope-OrgID`` to a multi-tenant Pyroscope.
    """

    enabled: bool = True
    mode: str = "sample"
    sample_interval: int = 512 * 1024
    nframe: int | None = None
    interval: float = 10.0
    top: int = 20
    leak_window: float = 1800.0
    exporters: tuple[str, ...] = ("prometheus",)
    host: str = "127.0.0.1"
    port: int = 9438
    port_range: int = 32
    token: str | None = None
    dump_signal: str | None = "SIGUSR2"
    dump_dir: str | None = None
    dump_keep: int = 10
    dump_max_bytes: int = 0
    dump_at: tuple[Threshold, ...] = tuple(parse_dump_at(",".join(DEFAULT_DUMP_AT)))
    termination_log: str | None = TERMINATION_LOG_AUTO
    pyroscope_url: str | None = None
    pyroscope_user: str | None = None
    pyroscope_password: str | None = None
    pyroscope_tenant_id: str | None = None
    top_routes: int = 10

    def __repr__(self) -> str:
        # The secrets must not reach a log line through a repr.
        secrets = {f.name for f in _FIELDS if f.secret}
        fields = ", ".join(
            f"{name}={'<redacted>' if name in secrets and value is not None else value!r}"
            for name, value in zip(self._fields, self)
        )
        return f"AgentConfig({fields})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> AgentConfig:
        """Settings from ``HEAPWATCH_*`` (bad values warn and fall back to the
        default), then ``overrides`` given in code (bad values raise
        ``ConfigError``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in _FIELDS:
            variable = ENV_PREFIX + field.name.upper()
            text = env.get(variable)
            if text is None or not text.strip():
                continue
            fallback = field.fallback
            if fallback is _DEFAULT:
                fallback = cls._field_defaults[field.name]
            values[field.name] = env_value(
                variable,
                text,
                field.parse,
                fallback,
                secret=field.secret,
                shown=field.none_means if fallback is None else None,
            )
        config = cls(**values)
        return config.replace(**overrides) if overrides else config

    def replace(self, **changes: object) -> AgentConfig:
        """A copy with ``changes`` checked as values given in code."""
        checked = {name: _check(name, value) for name, value in changes.items()}
        return self._replace(**checked)  # type: ignore[arg-type]

    @property
    def effective_nframe(self) -> int:
        """Frames kept per traceback: ``nframe``, or the mode's default."""
        return DEFAULT_NFRAME[self.mode] if self.nframe is None else self.nframe

    @property
    def reported_sample_interval(self) -> int:
        """The sample interval to publish: 0 in exact mode."""
        return self.sample_interval if self.mode == "sample" else 0


def _check(name: str, value: object) -> object:
    field = _FIELDS_BY_NAME.get(name)
    if field is None:
        raise ConfigError(
            f"unknown heapwatch setting {name!r}; the settings are "
            + ", ".join(f.name for f in _FIELDS)
        )
    if value is None and name in _OPTIONAL:
        return None
    if isinstance(value, str):
        text = value
    elif name == "dump_signal" and isinstance(getattr(value, "name", None), str):
        text = getattr(value, "name", "")  # a signal.Signals member
    elif name == "enabled" and isinstance(value, bool):
        return value
    elif isinstance(value, bool):
        raise ConfigError(f"{name} must not be a bool, got {value!r}")
    elif name == "exporters" and isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"exporters must be names, got {value!r}")
        text = ",".join(value) or "none"
    elif name == "dump_at" and isinstance(value, (list, tuple)):
        if all(isinstance(v, Threshold) for v in value):
            return tuple(value)
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"dump_at must be thresholds such as '90%' or '2GiB', got {value!r}")
        text = ",".join(value) or "none"
    elif name in _DURATIONS and isinstance(value, (int, float)):
        text = repr(float(value))
    elif isinstance(value, int):
        text = str(value)
    else:
        raise ConfigError(f"{name}={value!r} has the wrong type")
    try:
        return field.parse(text)
    except ValueError as exc:
        shown = "<redacted>" if field.secret else repr(value)
        raise ConfigError(f"{name}={shown} is invalid: expected {exc}") from None


def env_value(
    variable: str,
    text: str,
    parse: Callable[[str], T],
    default: T,
    *,
    secret: bool = False,
    shown: str | None = None,
) -> T:
    """``parse(text)``, or ``default`` after a warning naming the variable,
    the value (unless ``secret``), what is accepted and the default
    (``shown`` if given)."""
    try:
        return parse(text)
    except ValueError as exc:
        import logging  # noqa: PLC0415 (on the auto-start path: only when needed)

        logging.getLogger("heapwatch.config").warning(
            "%s=%s is invalid: expected %s; using %s",
            variable,
            f"<{len(text)} characters, redacted>" if secret else repr(text),
            exc,
            _show(default) if shown is None else shown,
        )
        return default


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value) or "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_environ(config: AgentConfig) -> dict[str, str]:
    """The ``HEAPWATCH_*`` variables that reproduce ``config`` in a child process."""
    env: dict[str, str] = {}
    for field in _FIELDS:
        value = getattr(config, field.name)
        if value is None and field.name not in ("dump_signal", "termination_log"):
            continue  # unset is how the environment says "none" for these
        text = repr(float(value)) if field.name in _DURATIONS else _show(value)
        env[ENV_PREFIX + field.name.upper()] = text
    return env


DEFAULTS = AgentConfig()
