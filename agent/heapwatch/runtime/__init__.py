"""What heapwatch runs on inside the service's process, below the agent.

The agent, the server and the exporters all use these; they import nothing
of heapwatch's but the C core:

* ``threads``: threads born with the service's signals blocked, whose work
  the core does not trace, their errors one log line;
* ``problems``: ``ProblemLog``, one line per problem, rate-limited;
* ``forks``: at-fork hooks through weak references;
* ``source``: ``CoreSource``, the one adapter over ``heapwatch._core`` that
  snapshots come from (the agent's cycle and the dump service);
* ``procmem``: the process's resident set, glibc's heap, ``process_start``;
* ``container``: the memory of the process's cgroup (limit, usage, working
  set, OOM kills, pressure).

Nothing is imported here: each user imports the module it needs.
"""
