"""heapwatch's dump file format under the name it was first published as.

The format lives in ``heapwatch.formats.dump`` (definition, writer, reader);
this module keeps ``from heapwatch import dumpfile`` working, with the same
names.
"""

from heapwatch.formats.dump import *  # noqa: F403 (the same public names)
from heapwatch.formats.dump import __all__  # noqa: F401 (the same public names)
