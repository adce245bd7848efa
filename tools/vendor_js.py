#!/usr/bin/env python3
"""Re-vendors the memory page's JavaScript libraries from the npm registry.

The page and the HTML report never load a library from the network: each one
is a file of the package, at the version pinned in
agent/heapwatch/server/static/vendor/manifest.json with its license.  This
script fetches each pinned version with ``npm pack NAME@VERSION`` (npm's own
client and registry settings), copies the files the manifest lists into
``vendor/NAME-VERSION/`` and records their sha256; ``--check`` only verifies
that the vendored files are the manifest's (no network).

    tools/vendor_js.py            # fetch and copy, rewrite the sums
    tools/vendor_js.py --check    # exit 1 if a file differs from its sum

To move a library to a new version: change its version in the manifest (and
the paths in heapwatch/server/page.py and static/page.html), run this script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

VENDOR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "agent",
    "heapwatch",
    "server",
    "static",
    "vendor",
)
MANIFEST = os.path.join(VENDOR, "manifest.json")


def _sha256(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def _fetch(library: dict, work: str) -> str:
    spec = f"{library['name']}@{library['version']}"
    subprocess.run(
        ["npm", "pack", "--silent", spec], cwd=work, check=True, stdout=subprocess.DEVNULL
    )
    (tarball,) = [n for n in os.listdir(work) if n.endswith(".tgz")]
    with tarfile.open(os.path.join(work, tarball)) as archive:
        # The "data" filter (3.12 on, and security releases before) keeps
        # every member inside work.
        if hasattr(tarfile, "data_filter"):
            archive.extractall(work, filter="data")
        else:
            archive.extractall(work)
    return os.path.join(work, "package")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify the sums only")
    options = parser.parse_args()
    with open(MANIFEST, encoding="utf-8") as file:
        manifest = json.load(file)
    bad = 0
    for library in manifest["libraries"]:
        folder = os.path.join(VENDOR, f"{library['name']}-{library['version']}")
        if options.check:
            for name, expected in library["files"].items():
                path = os.path.join(folder, os.path.basename(name))
                if not os.path.exists(path) or _sha256(path) != expected:
                    print(f"{path}: not the file of {library['name']} {library['version']}")
                    bad += 1
            continue
        with tempfile.TemporaryDirectory() as work:
            package = _fetch(library, work)
            os.makedirs(folder, exist_ok=True)
            for name in library["files"]:
                target = os.path.join(folder, os.path.basename(name))
                shutil.copyfile(os.path.join(package, name), target)
                library["files"][name] = _sha256(target)
    if not options.check:
        with open(MANIFEST, "w", encoding="utf-8") as file:
            json.dump(manifest, file, indent=2)
            file.write("\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
