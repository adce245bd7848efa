/* Route labels: which request an allocation was made for.
 *
 * A traceback carries a route id (0..HW_MAX_ROUTE) as part of its identity,
 * as it carries its domain: the same frames under two routes are two
 * tracebacks, and grouping by frames merges them again (so the drop-in and
 * every report that ignores routes see what they saw before).  The id is
 * read when the allocation is recorded, from the calling thread's current
 * contextvars Context, so asyncio tasks and threads run in a copied context
 * are attributed to the request that made them:
 *
 *   1. heapwatch's own ContextVar (heapwatch.runtime.routes.current_route),
 *      an int, set by the middlewares and heapwatch.routes.route();
 *   2. when that gives 0 or nothing: OpenTelemetry's current span, found in
 *      OpenTelemetry's own ContextVar (a Context, a dict) under its span
 *      key, and looked up by address in the span table, which heapwatch's
 *      span processor fills in on_start (the span's http.route, else its
 *      parent's) and empties in on_end.
 *
 * Neither step runs Python code or allocates: the context's HAMT is read
 * through the context's mapping methods (never PyContextVar_Get, whose
 * cache a read inside ContextVar.reset() would leave stale: routes.c), the dict lookup is by a str key whose hash is
 * cached, and the span table holds addresses only (no reference: a span
 * freed without on_end leaves an entry that its address's next span
 * replaces).  Only allocations that are recorded pay: in sample mode, the
 * sampled ones.
 *
 * set_span_routes(None, None) forgets every span.
 *
 * Every variable here is protected by the GIL: set from Python, read by the
 * hooks only when the calling thread holds the GIL (hw_route_current).
 */
#ifndef HEAPWATCH_ROUTES_H
#define HEAPWATCH_ROUTES_H

#include <stdint.h>

#include "compat.h"

#define HW_MAX_ROUTE 65535
/* Spans in flight that the table can name at once (a power of two); on_start
 * calls past it are refused and counted. */
#define HW_SPAN_ROUTES 4096

/* Whether a route source is set; read by the hooks without the GIL in the
 * raw domain, hence atomic.  Set with the GIL. */
extern int hw_routes_on;

/* GIL held, not finalizing, main interpreter.  The route of the calling
 * thread's current context, 0 when none.  Never raises, never runs Python. */
uint16_t hw_route_current(void);

/* GIL held.  var: a contextvars.ContextVar or None.  -1 with an exception
 * set on a wrong type. */
int hw_routes_set_var(PyObject *var);
int hw_routes_set_span_source(PyObject *var, PyObject *key);
/* GIL held.  route 0 forgets the span. */
void hw_routes_set_span(PyObject *span, uint16_t route);

/* GIL held. */
size_t hw_routes_span_count(void);
uint64_t hw_routes_span_dropped(void);

/* _core.set_route_var(var), _core.set_span_routes(var, key),
 * _core.span_route(span, route). */
PyObject *hw_py_set_route_var(PyObject *module, PyObject *var);
PyObject *hw_py_set_span_routes(PyObject *module, PyObject *args);
PyObject *hw_py_span_route(PyObject *module, PyObject *args);

#endif
