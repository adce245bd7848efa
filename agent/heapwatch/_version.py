"""heapwatch's version, in a module of its own so that every layer may read
it without importing the package's public face (``heapwatch/__init__``)."""

__version__ = "0.1.0"
