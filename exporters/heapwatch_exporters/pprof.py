"""pprof heap profiles under the name they were first published as.

pprof is a file format, so it lives with heapwatch's formats
(``heapwatch.formats.pprof``); this module keeps
``from heapwatch_exporters.pprof import ...`` working, with the same names.
"""

from heapwatch.formats.pprof import *  # noqa: F403 (the same public names)
from heapwatch.formats.pprof import __all__  # noqa: F401 (the same public names)
