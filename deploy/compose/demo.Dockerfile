# The demo service with heapwatch installed from its wheel: no compiler, no
# Python headers in the image.  Used by deploy/compose.yaml, built from the
# repository root after `make wheels` (or `make wheels VERSIONS=3.12`), which
# leaves the wheels in dist/.  tools/dockerfile-in-chroot runs these steps in
# a chroot of the same Debian, where no container runtime is.
FROM python:3.12-slim-bookworm

# The cp312 wheel (manylinux: any glibc 2.28 or newer).  From a package index
# of your own instead: pip install --index-url https://your.index/simple heapwatch
COPY dist/heapwatch-*-cp312-cp312-manylinux_*.whl /tmp/wheels/
# A venv of its own; installing (not just copying) puts
# heapwatch-autostart.pth in its site-packages: HEAPWATCH_ENABLED=1 then
# starts the agent in a program that never imports heapwatch, such as the demo.
# --only-binary: pip fails rather than compile anything.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --only-binary=:all: /tmp/wheels/heapwatch-*.whl \
    && rm -rf /tmp/wheels
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY examples/ examples/
EXPOSE 8000 9438
CMD ["python", "examples/demo_service.py"]
