"""The agent: a daemon thread that turns the core's snapshots into readings.

``interface`` is what the layers above use (``Site``, ``CycleResult``,
``Readings``, the ``Component`` protocol); ``agent`` runs the cycle and its
components; ``source`` adapts the C core; ``plugins`` finds components by
name; ``config``, ``autostart``, ``threads``, ``problems`` and ``procmem``
serve them.  ``heapwatch.start_agent`` and friends are the public names.

Nothing is imported here: the auto-start hook imports ``config`` and
``autostart`` alone while deciding whether to start.
"""
