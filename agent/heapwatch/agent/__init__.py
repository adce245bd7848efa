"""The agent: a daemon thread that turns the core's snapshots into readings.

``interface`` is the front door, all the layers above import of it with
``config`` (the settings): the types of ``contract`` (``Site``,
``CycleResult``, ``Readings``, the ``Component`` protocol) and the process's
agent.  ``agent`` runs the thread and its components; ``plugins`` finds
components by name; ``autostart`` is what the ``.pth`` hook starts.  What
they run on in the service's process (threads, problems, fork hooks, the
core as a snapshot source, the memory readings) is ``heapwatch.runtime``'s.
``heapwatch.start_agent`` and friends are the public names.

Nothing is imported here: the auto-start hook imports ``config`` and
``autostart`` alone while deciding whether to start.
"""
