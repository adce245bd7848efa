"""What a user installs: the package's files, its metadata and its one
version, read from the installed distribution (make test installs the
checkout; make wheel-test installs a built wheel, named by HEAPWATCH_WHEEL)."""

from __future__ import annotations

import os
import re
import subprocess
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

import heapwatch
from support.agent_process import clean_env, installed_python, installed_script

DIST = "heapwatch"
# What the wheel carries beside the modules: the auto-start hook at the root
# of site-packages, and the type markers and the core's stub.
SHIPPED = (
    "heapwatch-autostart.pth",
    "_heapwatch_pth.py",
    "heapwatch/py.typed",
    "heapwatch/_core.pyi",
    "heapwatch_exporters/py.typed",
)
PROJECT_URLS = {"Homepage", "Documentation", "Changelog", "Issues"}


@pytest.fixture(scope="module")
def dist() -> metadata.Distribution:
    installed_python()  # skips (or fails) when heapwatch is not installed
    return metadata.distribution(DIST)


def installed_files(dist: metadata.Distribution) -> set[str]:
    return {str(f) for f in dist.files or ()}


def test_heapwatch_is_imported_from_site_packages_not_from_a_checkout() -> None:
    installed_python()
    roots = {Path(sysconfig.get_path(key)).resolve() for key in ("purelib", "platlib")}
    here = Path(heapwatch.__file__).resolve()
    assert any(root in here.parents for root in roots), f"{here} is not under {roots}"


def test_the_autostart_hook_and_the_type_markers_are_installed(
    dist: metadata.Distribution,
) -> None:
    files = installed_files(dist)
    for name in SHIPPED:
        assert name in files, f"{name} is not in the installed distribution"
        assert Path(str(dist.locate_file(name))).is_file(), name
    pth = Path(sysconfig.get_path("purelib")) / "heapwatch-autostart.pth"
    assert pth.is_file(), f"{pth} missing: the agent would not start from the environment"


def test_one_version_for_the_package_its_metadata_and_its_command(
    dist: metadata.Distribution,
) -> None:
    assert dist.version == heapwatch.__version__
    done = subprocess.run(
        [installed_script("heapwatch"), "--version"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == f"heapwatch {heapwatch.__version__}"


def test_the_metadata_names_the_license_the_urls_and_the_requirements(
    dist: metadata.Distribution,
) -> None:
    meta = dist.metadata
    assert meta["License-Expression"] == "Apache-2.0"
    license_files = meta.get_all("License-File") or []
    assert license_files, "no License-File in the metadata"
    files = installed_files(dist)
    for name in license_files:
        shipped = [f for f in files if f.endswith(f".dist-info/licenses/{name}")]
        assert shipped, f"{name} named in the metadata but not installed"
        assert "Apache License" in Path(str(dist.locate_file(shipped[0]))).read_text()
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert set(urls) >= PROJECT_URLS, sorted(urls)
    assert all(u.startswith("https://") for u in urls.values()), urls
    requires = dist.requires or []
    assert any(r.startswith("prometheus-client") for r in requires), requires
    otlp = [r for r in requires if 'extra == "otlp"' in r]
    assert otlp, f"no requirement of the otlp extra: {requires}"
    assert "otlp" in (meta.get_all("Provides-Extra") or [])


def test_a_classifier_for_each_python_the_package_accepts(dist: metadata.Distribution) -> None:
    meta = dist.metadata
    accepted = meta["Requires-Python"]
    low = re.search(r">=3\.(\d+)", accepted)
    high = re.search(r"<3\.(\d+)", accepted)
    assert low and high, accepted
    classifiers = set(meta.get_all("Classifier") or [])
    for minor in range(int(low[1]), int(high[1])):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers, minor
    assert "Typing :: Typed" in classifiers


def test_the_wheel_under_test_is_the_one_installed(dist: metadata.Distribution) -> None:
    wheel = os.environ.get("HEAPWATCH_WHEEL")
    if not wheel:
        pytest.skip("HEAPWATCH_WHEEL names no wheel (make wheel-test sets it)")
    # name-version-python-abi-platform.whl (PEP 427)
    _name, version, python, abi, platforms = Path(wheel).stem.split("-")
    assert version == heapwatch.__version__
    tags = {
        line.split(": ", 1)[1]
        for line in (dist.read_text("WHEEL") or "").splitlines()
        if line.startswith("Tag: ")
    }
    assert tags == {f"{python}-{abi}-{p}" for p in platforms.split(".")}
    assert all(p.startswith("manylinux_") for p in platforms.split(".")), platforms
