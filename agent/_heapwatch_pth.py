"""Auto-start, as ``heapwatch-autostart.pth`` runs it when ``HEAPWATCH_ENABLED``
is set to something other than a false word.

A top-level module rather than part of the package: on an interpreter
heapwatch does not support, ``heapwatch/__init__`` raises ImportError before
any of the package's own code could catch it, and site.py would print that
traceback at the start of every process.  Here it becomes one warning line
and the process runs without heapwatch.  Parseable by Python 3.6, so that old
interpreters reach the warning too.
"""

try:
    import heapwatch.agent.autostart  # noqa: F401 (importing it starts the agent)
except ImportError as exc:
    import logging

    logging.getLogger("heapwatch.agent").warning(
        "heapwatch auto-start skipped; the service runs without it: %s", exc
    )
