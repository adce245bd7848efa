"""The layer contract (tools/check_layers.py, run by `make lint`) holds, and
fails on an upward import, an import past the agent's front door or a cycle,
function-level imports included."""

from __future__ import annotations

from pathlib import Path

from support.repo_scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
check_layers = load_script(ROOT / "tools" / "check_layers.py", "check_layers")


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


MINIMAL = {
    "agent/heapwatch/__init__.py": "",
    "agent/heapwatch/_errors.py": "",
    "agent/heapwatch/formats/__init__.py": "",
    "agent/heapwatch/tracemalloc/__init__.py": "from heapwatch.formats import report\n",
    "agent/heapwatch/formats/report.py": "from heapwatch import _errors\n",
    "agent/heapwatch/agent/__init__.py": "",
    "agent/heapwatch/agent/config.py": "",
    "exporters/heapwatch_exporters/__init__.py": "from heapwatch.agent import config\n",
}


def test_heapwatch_keeps_its_layers() -> None:
    # Given the repository's code, when its imports are read, then none goes up
    assert check_layers.check(ROOT) == []


def test_a_minimal_tree_that_keeps_the_layers_passes(tmp_path: Path) -> None:
    assert check_layers.check(tree(tmp_path, MINIMAL)) == []


def test_an_upward_import_inside_a_function_fails(tmp_path: Path) -> None:
    # Given a format that imports the agent lazily
    files = dict(MINIMAL)
    files["agent/heapwatch/formats/report.py"] = (
        "def late():\n    from heapwatch.agent.config import X\n    return X\n"
    )
    # When checked, then the line is named
    (problem,) = check_layers.check(tree(tmp_path, files))
    assert "agent/heapwatch/formats/report.py:2" in problem
    assert "a higher layer" in problem


def test_a_type_checking_import_counts(tmp_path: Path) -> None:
    files = dict(MINIMAL)
    files["agent/heapwatch/agent/config.py"] = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from heapwatch_exporters import Thing\n"
    )
    problems = check_layers.check(tree(tmp_path, files))
    assert any("imports heapwatch_exporters" in p and "higher layer" in p for p in problems)
    # (and heapwatch_exporters imports the config: a cycle too)
    assert "import cycle: heapwatch.agent.config -> heapwatch_exporters" in problems


def test_siblings_of_one_layer_stay_apart(tmp_path: Path) -> None:
    files = dict(MINIMAL)
    files["agent/heapwatch/server/__init__.py"] = "import heapwatch_exporters\n"
    (problem,) = check_layers.check(tree(tmp_path, files))
    assert "siblings" in problem


def test_an_agent_internal_imported_from_the_server_fails(tmp_path: Path) -> None:
    # Given the server importing the agent's thread module, past its front door
    files = dict(MINIMAL)
    files["agent/heapwatch/agent/agent.py"] = ""
    files["agent/heapwatch/server/__init__.py"] = (
        "from heapwatch.agent.config import AgentConfig\n"
        "from heapwatch.agent.agent import get_agent, start_agent\n"
    )
    # When checked, then that line is named once, and the doors to use instead
    (problem,) = check_layers.check(tree(tmp_path, files))
    assert problem.startswith("agent/heapwatch/server/__init__.py:2: ")
    assert "imports heapwatch.agent.agent, behind the agent's front door" in problem
    assert problem.endswith("import only heapwatch.agent.config, heapwatch.agent.interface")


def test_the_agents_front_door_is_open_to_every_layer_above(tmp_path: Path) -> None:
    # Given the server, an exporter, the CLI and the face importing the
    # agent's interface, and the auto-start hook its side door
    files = dict(MINIMAL)
    files["agent/heapwatch/agent/interface.py"] = "from heapwatch.agent import agent\n"
    files["agent/heapwatch/agent/agent.py"] = "from heapwatch.agent import config\n"
    files["agent/heapwatch/agent/autostart.py"] = "from heapwatch.agent import agent\n"
    files["agent/heapwatch/server/__init__.py"] = "from heapwatch.agent import interface\n"
    files["exporters/heapwatch_exporters/__init__.py"] = (
        "from heapwatch.agent.interface import Readings\n"
    )
    files["agent/heapwatch/cli/__init__.py"] = "from heapwatch.agent.interface import get_agent\n"
    files["agent/heapwatch/__init__.py"] = "from heapwatch.agent.interface import Agent\n"
    files["agent/_heapwatch_pth.py"] = "import heapwatch.agent.autostart\n"
    # Then nothing fails (inside the agent, its modules import one another)
    assert check_layers.check(tree(tmp_path, files)) == []


def test_a_cycle_within_a_layer_fails(tmp_path: Path) -> None:
    files = dict(MINIMAL)
    files["agent/heapwatch/agent/a.py"] = "from heapwatch.agent import b\n"
    files["agent/heapwatch/agent/b.py"] = "def f():\n    from heapwatch.agent import a\n"
    problems = check_layers.check(tree(tmp_path, files))
    assert problems == ["import cycle: heapwatch.agent.a -> heapwatch.agent.b"]


def test_a_module_outside_every_layer_is_named(tmp_path: Path) -> None:
    # A new module under heapwatch/ gets its layer in LAYERS before it passes.
    files = dict(MINIMAL)
    files["agent/heapwatch/newthing.py"] = ""
    (problem,) = check_layers.check(tree(tmp_path, files))
    assert "heapwatch.newthing belongs to no layer" in problem
