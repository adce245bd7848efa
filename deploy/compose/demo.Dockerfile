# The demo service with heapwatch installed (the C extension is built here);
# used by deploy/compose.yaml, built from the repository root.
FROM python:3.12-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY agent/ agent/
COPY exporters/ exporters/
# Installing (not just copying) puts heapwatch-autostart.pth in site-packages:
# HEAPWATCH_ENABLED=1 then starts the agent in a program that never imports
# heapwatch, such as the demo.
RUN pip install --no-cache-dir . && rm -rf build

COPY examples/ examples/
EXPOSE 8000 9438
CMD ["python", "examples/demo_service.py"]
