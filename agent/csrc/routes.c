#include "compat.h" /* Python.h first, as CPython requires: its _POSIX_C_SOURCE before libc's */
#include "routes.h"

#include <string.h>

int hw_routes_on;

/* GIL: strong references, replaced only from Python. */
static PyObject *route_var;
static PyObject *span_var;
static PyObject *span_key;

/* GIL: the span table, open addressing with linear probing and
 * backward-shift deletion (no tombstones: spans come and go all the time).
 * Kept at most half full, so a probe ends quickly. */
typedef struct {
    uintptr_t span; /* 0: empty */
    uint16_t route;
} span_slot_t;

static span_slot_t spans[HW_SPAN_ROUTES * 2];
static size_t span_count;
static uint64_t span_dropped;

#define SPAN_MASK ((size_t)(HW_SPAN_ROUTES * 2 - 1))

static inline size_t
span_home(uintptr_t span)
{
    /* Objects are 16-byte aligned: the low bits say nothing. */
    return (size_t)((((uint64_t)span >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 40) & SPAN_MASK;
}

static span_slot_t *
span_find(uintptr_t span)
{
    for (size_t i = span_home(span);; i = (i + 1) & SPAN_MASK) {
        if (spans[i].span == span || spans[i].span == 0) {
            return &spans[i];
        }
    }
}

static void
span_remove(span_slot_t *slot)
{
    size_t hole = (size_t)(slot - spans);
    for (size_t i = (hole + 1) & SPAN_MASK; spans[i].span != 0; i = (i + 1) & SPAN_MASK) {
        size_t home = span_home(spans[i].span);
        /* Moves back an entry whose home is not in (hole, i]. */
        if (((i - home) & SPAN_MASK) >= ((i - hole) & SPAN_MASK)) {
            spans[hole] = spans[i];
            hole = i;
        }
    }
    spans[hole].span = 0;
    spans[hole].route = 0;
    span_count--;
}

void
hw_routes_set_span(PyObject *span, uint16_t route)
{
    span_slot_t *slot = span_find((uintptr_t)span);
    if (slot->span != 0) {
        if (route == 0) {
            span_remove(slot);
        }
        else {
            slot->route = route;
        }
        return;
    }
    if (route == 0) {
        return;
    }
    if (span_count >= HW_SPAN_ROUTES) {
        span_dropped++;
        return;
    }
    slot->span = (uintptr_t)span;
    slot->route = route;
    span_count++;
}

size_t
hw_routes_span_count(void)
{
    return span_count;
}

uint64_t
hw_routes_span_dropped(void)
{
    return span_dropped;
}

static void
publish(void)
{
    __atomic_store_n(&hw_routes_on, route_var != NULL || span_var != NULL, __ATOMIC_RELAXED);
}

static int
check_var(PyObject *var)
{
    if (var != Py_None && !PyContextVar_CheckExact(var)) {
        PyErr_Format(PyExc_TypeError, "expected a contextvars.ContextVar or None, not %.200s",
                     Py_TYPE(var)->tp_name);
        return -1;
    }
    return 0;
}

int
hw_routes_set_var(PyObject *var)
{
    if (check_var(var) < 0) {
        return -1;
    }
    Py_XSETREF(route_var, var == Py_None ? NULL : Py_NewRef(var));
    publish();
    return 0;
}

int
hw_routes_set_span_source(PyObject *var, PyObject *key)
{
    if (check_var(var) < 0) {
        return -1;
    }
    if ((var == Py_None) != (key == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "give both the context variable and the span key, or neither");
        return -1;
    }
    if (key != Py_None && !PyUnicode_CheckExact(key)) {
        PyErr_Format(PyExc_TypeError, "the span key must be a str, not %.200s", Py_TYPE(key)->tp_name);
        return -1;
    }
    if (key != Py_None && PyObject_Hash(key) == -1) { /* cached now: the hooks never hash */
        return -1;
    }
    if (var == Py_None) {
        /* Off: what on_start told is no longer kept up to date by on_end. */
        memset(spans, 0, sizeof(spans));
        span_count = 0;
    }
    Py_XSETREF(span_var, var == Py_None ? NULL : Py_NewRef(var));
    Py_XSETREF(span_key, key == Py_None ? NULL : Py_NewRef(key));
    publish();
    return 0;
}

/* The value var has in the calling thread's current context (a new
 * reference), or NULL; never its default.
 *
 * Not PyContextVar_Get: it caches what it finds in the variable, and an
 * allocation can be recorded inside ContextVar.reset(), after reset
 * cleared that cache and before it removed the value from the context.
 * PyContextVar_Get would then cache the value being removed, a borrowed
 * pointer that reset() never clears again: the host's var.get() would
 * return the old value, freed by then (tests/core/test_routes.py,
 * test_reading_a_route_leaves_the_hosts_variables_as_they_are).  The
 * context's own mapping methods read its HAMT and cache nothing. */
static PyObject *
context_value(PyObject *var)
{
    PyObject *context = PyThreadState_Get()->context;
    if (context == NULL || !PyContext_CheckExact(context)) {
        return NULL;
    }
    /* The slots themselves: PyObject_GetItem's checks in a debug build
     * object to an exception set, and the host may have one set.  contains
     * first: a missing key would raise, and build a KeyError. */
    PyTypeObject *type = Py_TYPE(context);
    if (type->tp_as_sequence->sq_contains(context, var) != 1) {
        return NULL;
    }
    return type->tp_as_mapping->mp_subscript(context, var);
}

/* The int a ContextVar holds, 0 when unset or not a route id. */
static uint16_t
var_route(PyObject *var)
{
    PyObject *value = context_value(var);
    if (value == NULL) {
        return 0;
    }
    uint16_t route = 0;
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long v = PyLong_AsLongAndOverflow(value, &overflow);
        if (!overflow && v > 0 && v <= HW_MAX_ROUTE) {
            route = (uint16_t)v;
        }
    }
    Py_DECREF(value); /* the context holds another reference */
    return route;
}

static uint16_t
span_route(void)
{
    if (span_count == 0) {
        return 0;
    }
    PyObject *context = context_value(span_var);
    if (context == NULL) {
        return 0;
    }
    uint16_t route = 0;
    /* OpenTelemetry's Context is a dict subclass whose keys are str: the
     * lookup compares str only, and runs no Python code.  PyDict_GetItem,
     * not the WithError kind: an allocation can be recorded while the host
     * has an exception set, which must stay as it is. */
    if (PyDict_Check(context)) {
        PyObject *span = PyDict_GetItem(context, span_key); /* borrowed */
        if (span != NULL) {
            span_slot_t *slot = span_find((uintptr_t)span);
            route = slot->span != 0 ? slot->route : 0;
        }
    }
    Py_DECREF(context);
    return route;
}

uint16_t
hw_route_current(void)
{
    uint16_t route = 0;
    if (route_var != NULL) {
        route = var_route(route_var);
    }
    if (route == 0 && span_var != NULL) {
        route = span_route();
    }
    return route;
}

/* ---- the module's functions ------------------------------------------- */

PyObject *
hw_py_set_route_var(PyObject *module, PyObject *var)
{
    (void)module;
    if (hw_routes_set_var(var) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *
hw_py_set_span_routes(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *var, *key;
    if (!PyArg_ParseTuple(args, "OO:set_span_routes", &var, &key) ||
        hw_routes_set_span_source(var, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *
hw_py_span_route(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *span;
    long route;
    if (!PyArg_ParseTuple(args, "Ol:span_route", &span, &route)) {
        return NULL;
    }
    if (route < 0 || route > HW_MAX_ROUTE) {
        PyErr_Format(PyExc_ValueError, "route must be from 0 to %d, not %ld", HW_MAX_ROUTE, route);
        return NULL;
    }
    hw_routes_set_span(span, (uint16_t)route);
    Py_RETURN_NONE;
}
