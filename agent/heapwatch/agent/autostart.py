"""Starts the agent when ``HEAPWATCH_ENABLED`` is true; imported by the ``.pth`` hook.

``heapwatch-autostart.pth`` imports this module (through the top-level
``_heapwatch_pth``) only when ``HEAPWATCH_ENABLED`` is set to something other
than a false word; anything unrecognised comes here so that ``_config`` warns
about it.  It never raises (a failure is a warning: the service starts
anyway), and it imports nothing heavy unless the value is true: the false
words are recognised here too, without importing ``heapwatch.agent.config``, for
an import that does not come from the hook.

Under ``python -E`` or ``-I`` (``sys.flags.ignore_environment``) nothing
starts, whatever ``HEAPWATCH_ENABLED`` says: the process asked to be left as
its environment would not make it, as CPython then ignores
``PYTHONTRACEMALLOC`` (the ``.pth`` line checks the flag first, too).
``start_agent()`` called by the application itself still starts the agent.

Nor does it start in a subinterpreter, which runs site and this hook again:
the agent is the process's, the main interpreter's (a second one in each
subinterpreter would trace nothing more and serve twice).

Nor in multiprocessing's resource tracker, a helper process that the
``spawn`` and ``forkserver`` start methods launch beside a service's workers
(``uvicorn --workers 2`` took four ports: the master, two workers and it):
it runs no code of the service and holds none of its data, so an agent there
would only add a port, a thread and a series that say nothing.  Which
processes get an agent is in docs/design/agent.md ("The port rule").
"""

import os
import sys

# heapwatch.agent.config's false words, and the .pth line's; a test keeps the three in step.
_FALSE_WORDS = ("", "0", "false", "no", "off", "n", "f")
# How multiprocessing starts its helpers: ``python -c "<this>..."``
# (``semaphore_tracker`` before 3.8 named the resource tracker).
_HELPER_CODE = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.semaphore_tracker import main",
)


def _command_line() -> list[str]:
    orig = getattr(sys, "orig_argv", None)  # 3.10+
    if orig is not None:
        return list(orig)
    try:
        # 3.9: sys.argv lacks -c's code.  Read as the interpreter starts,
        # before any code of the service runs (no descriptor of its to take).
        with open("/proc/self/cmdline", "rb") as cmdline:
            return [os.fsdecode(arg) for arg in cmdline.read().split(b"\0")]
    except OSError:
        return []


def _in_multiprocessing_helper() -> bool:
    words = _command_line()
    try:
        code = words[words.index("-c") + 1]
    except (ValueError, IndexError):
        return False
    return code.lstrip().startswith(_HELPER_CODE)


def _in_subinterpreter() -> bool:
    try:
        import _interpreters as interpreters  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 (3.13+; only when on)
    except ImportError:
        try:
            import _xxsubinterpreters as interpreters  # type: ignore[import-not-found,no-redef,unused-ignore]  # noqa: PLC0415 (3.9-3.12)
        except ImportError:
            return False
    current, main = interpreters.get_current(), interpreters.get_main()
    if isinstance(current, tuple):  # 3.13+: (id, how it was made)
        current, main = current[0], main[0]
    return int(current) != int(main)


def _autostart() -> None:
    if sys.flags.ignore_environment:
        return
    if os.environ.get("HEAPWATCH_ENABLED", "").strip().lower() in _FALSE_WORDS:
        return
    try:
        if _in_subinterpreter() or _in_multiprocessing_helper():
            return
        from heapwatch.agent.config import AgentConfig  # noqa: PLC0415 (only when on)

        config = AgentConfig.from_env()  # a bad HEAPWATCH_ENABLED warns and reads false
        if config.enabled:
            from heapwatch.agent.agent import start_agent  # noqa: PLC0415 (only when on)

            start_agent(config)
    except Exception as exc:
        import logging  # noqa: PLC0415 (only on failure)

        log = logging.getLogger("heapwatch.agent")
        log.warning("heapwatch auto-start failed; the service runs without it: %r", exc)
        log.debug("the traceback of the above", exc_info=True)


_autostart()
