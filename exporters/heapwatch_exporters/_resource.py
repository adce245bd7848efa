"""The OpenTelemetry resource of the service: one home for the metrics'
resource (``otel.py``), the profile pushers' labels (``pyroscope.py``) and
the OpenTelemetry profiles' resource (``otlp_profiles.py``).

``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` as the OpenTelemetry
SDK reads them, plus ``process.pid`` so that the processes of a service
(gunicorn workers, say) stay apart.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

__all__ = ["UNKNOWN_SERVICE", "resource_attributes", "service_attributes", "service_resource"]

UNKNOWN_SERVICE = "unknown_service"
"""The SDK's service.name when none is set."""


def service_resource() -> Resource:
    """The SDK's resource (ImportError without the ``otel`` extra)."""
    # The SDK only when a caller needs it: the pyroscope exporter runs without.
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

    return Resource.create({"process.pid": os.getpid()})


def resource_attributes() -> dict[str, object]:
    """The resource's attributes, typed as the SDK has them (``process.pid``
    an int).  Without the SDK, only ``OTEL_SERVICE_NAME`` and
    ``process.pid`` (the SDK's detectors and its parser of
    ``OTEL_RESOURCE_ATTRIBUTES`` are not copied here)."""
    try:
        resource = service_resource()
    except ImportError:
        name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or UNKNOWN_SERVICE
        return {"service.name": name, "process.pid": os.getpid()}
    return dict(resource.attributes)


def service_attributes() -> dict[str, str]:
    """The resource's attributes as strings (Pyroscope's labels)."""
    return {key: str(value) for key, value in resource_attributes().items()}
