"""heapwatch over HTTP, and its dumps on demand.

``router`` (the WSGI routes, behind a bearer token for ``/debug/``), ``http``
(the server thread and the port rule), ``dumps`` (the dump service: dump
files, retention, the dump signal), ``debug_routes`` (the ``/debug/``
routes, a face of the dump service) and ``served_dumps`` (the two together,
the routes imported only by an agent that serves).  The agent finds these by name
(``heapwatch.agent.plugins``) and never imports them.
"""
