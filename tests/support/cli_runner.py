"""Running the ``heapwatch`` command in the test's process: the one helper
the CLI tests share."""

from __future__ import annotations

import pytest

from heapwatch.cli import main

__all__ = ["run_cli"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``heapwatch *argv``; argparse's exits
    are statuses, as the shell would see them."""
    try:
        status = main(list(argv))
    except SystemExit as exit:
        status = int(exit.code or 0)
    out, err = capsys.readouterr()
    return status, out, err
