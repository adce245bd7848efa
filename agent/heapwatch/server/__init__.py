"""heapwatch over HTTP, and its dumps on demand.

``router`` (the WSGI routes, behind a bearer token for ``/debug/``), ``http``
(the server thread and the port rule), ``dumps`` (the dump service: dump
files, retention, the dump signal) and ``debug_routes`` (the ``/debug/``
routes, a face of the dump service).  The agent finds these by name
(``heapwatch.agent.plugins``) and never imports them.
"""
