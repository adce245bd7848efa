"""heapwatch's memory as an OpenTelemetry profiles request.

:func:`encode_profiles_request` writes an ``ExportProfilesServiceRequest`` of
opentelemetry-proto's ``v1development`` profiles, as of proto v1.10.0 (the
``Sample`` field numbers of v1.9.0 differ: a receiver of the other version
misreads it), by hand with :mod:`heapwatch.formats.protobuf`: no protobuf
runtime in the monitored service, and the wire format does not follow the
opentelemetry-proto release the service happens to have.

One resource, one scope (``heapwatch``), and one profile per sample type
(``inuse_space`` and ``alloc_space``: an OTLP profile has one), all sharing
the request's one dictionary: strings, functions, locations and stacks are
written once.  ``docs/design/pprof.md`` maps the fields.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from heapwatch.formats.pprof import INT64_MAX, PYTHON_MAPPING, ROUTE_LABEL, UNKNOWN, HeapSample
from heapwatch.formats.protobuf import ProtoWriter, encode_varint

__all__ = ["FRAME_TYPE", "OTLP_SAMPLE_TYPES", "PROFILE_SCOPE", "encode_profiles_request"]

OTLP_SAMPLE_TYPES = (("inuse_space", "bytes"), ("alloc_space", "bytes"))
"""The request's profiles, in order: live bytes and bytes allocated since
tracing started."""
PROFILE_SCOPE = "heapwatch"
"""The instrumentation scope's name."""
FRAME_TYPE = ("profile.frame.type", "cpython")
"""Every location's attribute, the semantic conventions' frame type."""

_UNKNOWN_FRAME = (UNKNOWN, 0, UNKNOWN)
_PERIOD_TYPE = ("space", "bytes")

# Field numbers, opentelemetry-proto v1.10.0.
_REQUEST_RESOURCE_PROFILES = 1
_REQUEST_DICTIONARY = 2
_RESOURCE_PROFILES_RESOURCE = 1
_RESOURCE_PROFILES_SCOPE_PROFILES = 2
_RESOURCE_ATTRIBUTES = 1
_SCOPE_PROFILES_SCOPE = 1
_SCOPE_PROFILES_PROFILES = 2
_SCOPE_NAME = 1
_SCOPE_VERSION = 2
_KEY_VALUE_KEY = 1
_KEY_VALUE_VALUE = 2
_ANY_STRING = 1
_ANY_BOOL = 2
_ANY_INT = 3
_DICT_MAPPING = 1
_DICT_LOCATION = 2
_DICT_FUNCTION = 3
_DICT_LINK = 4
_DICT_STRING = 5
_DICT_ATTRIBUTE = 6
_DICT_STACK = 7
_PROFILE_SAMPLE_TYPE = 1
_PROFILE_SAMPLES = 2
_PROFILE_TIME_UNIX_NANO = 3
_PROFILE_DURATION_NANO = 4
_PROFILE_PERIOD_TYPE = 5
_PROFILE_PERIOD = 6
_PROFILE_ID = 7
_VALUE_TYPE_TYPE = 1
_VALUE_TYPE_UNIT = 2
_SAMPLE_STACK_INDEX = 1
_SAMPLE_ATTRIBUTE_INDICES = 2
_SAMPLE_VALUES = 4
_MAPPING_FILENAME = 4
_STACK_LOCATIONS = 1
_LOCATION_MAPPING = 1
_LOCATION_LINES = 3
_LOCATION_ATTRIBUTES = 4
_LINE_FUNCTION = 1
_LINE_LINE = 2
_FUNCTION_NAME = 1
_FUNCTION_FILENAME = 3
_ATTRIBUTE_KEY = 1
_ATTRIBUTE_VALUE = 2

# Index 1 of the mapping and attribute tables (index 0 is the zero value
# every table starts with).
_PYTHON_MAPPING_INDEX = 1
_FRAME_TYPE_INDEX = 1


def encode_profiles_request(
    samples: Iterable[HeapSample],
    *,
    resource: Mapping[str, object],
    scope_version: str,
    mode: str,
    sample_interval: int,
    time_nanos: int,
    duration_nanos: int = 0,
) -> bytes:
    """The uncompressed ``ExportProfilesServiceRequest`` of ``samples``.

    ``resource`` is the service's resource (a str, bool or int value is
    written as such, any other as its str); ``mode`` and ``sample_interval``
    as for :func:`heapwatch.formats.pprof.encode_heap_profile`: in sample
    mode the profiles' period is ``sample_interval`` bytes. A sample with no
    value for a profile's type is left out of that profile.
    """
    dictionary = _Dictionary()
    stack = dictionary.stack
    route = dictionary.route
    rows = [
        (stack(s.frames or (_UNKNOWN_FRAME,)), s.size, s.alloc_size, route(s.route))
        for s in samples
    ]
    period = sample_interval if mode == "sample" else 0
    scope = ProtoWriter()
    scope.bytes_field(_SCOPE_NAME, PROFILE_SCOPE.encode())
    scope.bytes_field(_SCOPE_VERSION, scope_version.encode())
    scope_profiles = ProtoWriter()
    scope_profiles.message_field(_SCOPE_PROFILES_SCOPE, scope)
    for column, (type_, unit) in enumerate(OTLP_SAMPLE_TYPES, start=1):
        profile = ProtoWriter()
        profile.message_field(_PROFILE_SAMPLE_TYPE, dictionary.value_type(type_, unit))
        for row in rows:
            value = row[column]
            if value > 0:
                profile.extend(_sample_field(row[0], min(value, INT64_MAX), row[3]))
        profile.fixed64_field(_PROFILE_TIME_UNIX_NANO, time_nanos)
        profile.int_field(_PROFILE_DURATION_NANO, duration_nanos)
        if period:
            profile.message_field(_PROFILE_PERIOD_TYPE, dictionary.value_type(*_PERIOD_TYPE))
            profile.int_field(_PROFILE_PERIOD, period)
        # All zeroes is invalid; random bytes are what the SDKs write too.
        profile.bytes_field(_PROFILE_ID, os.urandom(16))
        scope_profiles.message_field(_SCOPE_PROFILES_PROFILES, profile)

    resource_profiles = ProtoWriter()
    resource_profiles.message_field(_RESOURCE_PROFILES_RESOURCE, _resource(resource))
    resource_profiles.message_field(_RESOURCE_PROFILES_SCOPE_PROFILES, scope_profiles)
    request = ProtoWriter()
    request.message_field(_REQUEST_RESOURCE_PROFILES, resource_profiles)
    request.message_field(_REQUEST_DICTIONARY, dictionary.finish())
    return request.getvalue()


def _sample_field(stack_index: int, value: int, attribute: int = 0) -> bytes:
    """One encoded ``Profile.samples`` field: a Sample of one value, with
    the attribute of that index (its route) unless 0."""
    sample = ProtoWriter()
    sample.int_field(_SAMPLE_STACK_INDEX, stack_index)
    if attribute:
        sample.packed_field(_SAMPLE_ATTRIBUTE_INDICES, (attribute,))
    sample.bytes_field(_SAMPLE_VALUES, encode_varint(value))
    field = ProtoWriter()
    field.message_field(_PROFILE_SAMPLES, sample)
    return field.getvalue()


def _text(text: str) -> bytes:
    # proto3 readers reject invalid UTF-8: a lone surrogate becomes an escape.
    return text.encode("utf-8", "backslashreplace")


def _any_value(value: object) -> ProtoWriter:
    any_value = ProtoWriter()
    if isinstance(value, bool):
        any_value.bool_field(_ANY_BOOL, value)
        if not value:  # proto3 drops a false: an empty bool is still a bool
            any_value.extend(b"\x10\x00")
    elif isinstance(value, int) and -(1 << 63) <= value <= INT64_MAX:
        any_value.int_field(_ANY_INT, value)
        if value == 0:
            any_value.extend(b"\x18\x00")
    else:
        any_value.bytes_field(_ANY_STRING, _text(str(value)))
    return any_value


def _resource(attributes: Mapping[str, object]) -> ProtoWriter:
    resource = ProtoWriter()
    for key, value in attributes.items():
        pair = ProtoWriter()
        pair.bytes_field(_KEY_VALUE_KEY, _text(key))
        pair.message_field(_KEY_VALUE_VALUE, _any_value(value))
        resource.message_field(_RESOURCE_ATTRIBUTES, pair)
    return resource


class _Dictionary:
    """The request's ``ProfilesDictionary``: each table starts with its zero
    value; an element is encoded when it is first seen."""

    def __init__(self) -> None:
        self._strings: dict[str, int] = {}
        self._functions: dict[tuple[str, str], int] = {}
        self._locations: dict[object, bytes] = {}
        """frame -> its location index, varint-encoded for a stack's packed field."""
        self._stacks: dict[tuple[object, ...], int] = {}
        self._string_table = ProtoWriter()
        self._function_table = ProtoWriter()
        self._location_table = ProtoWriter()
        self._stack_table = ProtoWriter()
        # The routes' http.route attributes, after the frame type's (index 1).
        self._routes: dict[str, int] = {}
        self._route_table = ProtoWriter()
        self._string("")
        self._function_table.bytes_field(_DICT_FUNCTION, b"")
        self._location_table.bytes_field(_DICT_LOCATION, b"")
        self._stack_table.bytes_field(_DICT_STACK, b"")

    def _string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self._strings)
            self._string_table.bytes_field(_DICT_STRING, _text(text))
        return index

    def _function(self, name: str, filename: str) -> int:
        key = (name, filename)
        index = self._functions.get(key)
        if index is None:
            index = self._functions[key] = len(self._functions) + 1
            function = ProtoWriter()
            function.int_field(_FUNCTION_NAME, self._string(name))
            function.int_field(_FUNCTION_FILENAME, self._string(filename))
            self._function_table.message_field(_DICT_FUNCTION, function)
        return index

    def _location(self, frame: tuple[str, int, str]) -> bytes:
        try:
            filename, lineno, name = frame
        except (TypeError, ValueError):
            raise ValueError(
                f"a frame must be (filename, lineno, function), not {frame!r}"
            ) from None
        index = len(self._locations) + 1
        line = ProtoWriter()
        line.int_field(_LINE_FUNCTION, self._function(name or UNKNOWN, filename or UNKNOWN))
        line.int_field(_LINE_LINE, lineno)
        location = ProtoWriter()
        location.int_field(_LOCATION_MAPPING, _PYTHON_MAPPING_INDEX)
        location.message_field(_LOCATION_LINES, line)
        location.packed_field(_LOCATION_ATTRIBUTES, (_FRAME_TYPE_INDEX,))
        self._location_table.message_field(_DICT_LOCATION, location)
        encoded = self._locations[frame] = encode_varint(index)
        return encoded

    def stack(self, frames: Sequence[tuple[str, int, str]]) -> int:
        """The index of the stack of ``frames`` (leaf first), added if new."""
        key = tuple(frames)
        index = self._stacks.get(key)
        if index is None:
            known = self._locations.get
            # Encoded indices are never empty: "or" only adds on a miss.
            packed = b"".join([known(f) or self._location(f) for f in key])
            index = self._stacks[key] = len(self._stacks) + 1
            stack = ProtoWriter()
            stack.bytes_field(_STACK_LOCATIONS, packed)
            self._stack_table.message_field(_DICT_STACK, stack)
        return index

    def route(self, name: str) -> int:
        """The index of the attribute ``http.route=name``, added if new; 0
        (none) for no route."""
        if not name:
            return 0
        index = self._routes.get(name)
        if index is None:
            index = self._routes[name] = _FRAME_TYPE_INDEX + 1 + len(self._routes)
            attribute = ProtoWriter()
            attribute.int_field(_ATTRIBUTE_KEY, self._string(ROUTE_LABEL))
            attribute.message_field(_ATTRIBUTE_VALUE, _any_value(name))
            self._route_table.message_field(_DICT_ATTRIBUTE, attribute)
        return index

    def value_type(self, type_: str, unit: str) -> ProtoWriter:
        value_type = ProtoWriter()
        value_type.int_field(_VALUE_TYPE_TYPE, self._string(type_))
        value_type.int_field(_VALUE_TYPE_UNIT, self._string(unit))
        return value_type

    def finish(self) -> ProtoWriter:
        """The encoded dictionary; strings interned before this call only."""
        mapping = ProtoWriter()
        mapping.int_field(_MAPPING_FILENAME, self._string(PYTHON_MAPPING))
        frame_type = ProtoWriter()
        frame_type.int_field(_ATTRIBUTE_KEY, self._string(FRAME_TYPE[0]))
        frame_type.message_field(_ATTRIBUTE_VALUE, _any_value(FRAME_TYPE[1]))
        dictionary = ProtoWriter()
        dictionary.bytes_field(_DICT_MAPPING, b"")
        dictionary.message_field(_DICT_MAPPING, mapping)
        dictionary.extend(self._location_table.getvalue())
        dictionary.extend(self._function_table.getvalue())
        dictionary.bytes_field(_DICT_LINK, b"")
        dictionary.extend(self._string_table.getvalue())
        dictionary.bytes_field(_DICT_ATTRIBUTE, b"")
        dictionary.message_field(_DICT_ATTRIBUTE, frame_type)
        dictionary.extend(self._route_table.getvalue())
        dictionary.extend(self._stack_table.getvalue())
        return dictionary
