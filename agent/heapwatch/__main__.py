"""``python -m heapwatch``: the ``heapwatch`` command."""

from heapwatch.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
