"""The agent: a daemon thread that turns the core's snapshots into readings.

``interface`` is what the layers above use (``Site``, ``CycleResult``,
``Readings``, the ``Component`` protocol); ``agent`` runs the cycle and its
components; ``plugins`` finds components by name; ``config`` and
``autostart`` serve them.  What they run on in the service's process
(threads, problems, fork hooks, the core as a snapshot source, the memory
readings) is ``heapwatch.runtime``'s.  ``heapwatch.start_agent`` and friends
are the public names.

Nothing is imported here: the auto-start hook imports ``config`` and
``autostart`` alone while deciding whether to start.
"""
