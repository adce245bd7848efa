"""``python -m heapwatch``: the ``heapwatch`` command."""

from heapwatch._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
