"""``heapwatch top``, ``diff`` and ``convert``: output, conversions, and one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import tracemalloc as stdlib_tm
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import heapwatch
import heapwatch_exporters
from heapwatch import tracemalloc as hw_tm
from heapwatch.formats.dump import DumpHeader, read_dump, write_dump
from heapwatch.formats.pprof import ROUTE_LABEL, decode_profile
from heapwatch.formats.report import format_text, top_report
from heapwatch.tracemalloc.raw import raw_statistics
from support.cli_runner import run_cli

APP = "leak = []\ndef grow():\n    leak.append(bytearray(100_000))  # LEAK\ngrow()\n"
INTERVAL = 64 * 1024


def traces_for(app: str, leaks: int) -> list[tuple[int, int, tuple[tuple[str, int], ...], int]]:
    grow = ((app, 3), (app, 4))
    return [(0, 100_057, grow, 2)] * leaks + [
        (0, 64, ((app, 1),), 1),
        (0, 512, (("<frozen importlib._bootstrap>", 241),), 1),
        (7, 1024, (("/usr/lib/lib.py", 9),), 1),
    ]


def dump(
    path: Path, traces: list[tuple[int, int, tuple[tuple[str, int], ...], int]], **kw: object
) -> str:
    header = DumpHeader(
        python_version="3.11.7",
        pid=4242,
        timestamp=1_700_000_000.0 + float(kw.pop("later", 0)),  # type: ignore[arg-type]
        mode=str(kw.pop("mode", "exact")),
        sample_interval=int(kw.pop("sample_interval", 0)),  # type: ignore[call-overload]
        traceback_limit=2,
        extra={"hostname": "web-1"},
    )
    write_dump(str(path), header, traces)
    return str(path)


@pytest.fixture
def app(tmp_path: Path) -> str:
    source = tmp_path / "app.py"
    source.write_text(APP)
    return str(source)


run = run_cli


def test_top_shows_the_pretty_top_of_a_dump(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "a.hwdump", traces_for(app, 3))
    status, out, err = run(capsys, "top", path, "--limit", "2")
    assert (status, err) == (0, "")
    assert out == (
        "Top 2 lines\n"
        f"#1: {app}:3: 293.1 KiB\n"
        "    leak.append(bytearray(100_000))  # LEAK\n"
        "#2: /usr/lib/lib.py:9: 1.0 KiB\n"
        "2 other: 0.6 KiB\n"
        "Total allocated size: 294.7 KiB\n"
    )
    # the same layout as the endpoint's: one formatter
    stats = hw_tm.Snapshot.load(path).statistics("lineno")
    total = sum(s.size for s in stats), sum(s.count for s in stats)
    report = top_report(
        raw_statistics(stats),
        total,
        key_type="lineno",
        cumulative=False,
        limit=2,
        mode="exact",
        sample_interval=0,
    )
    assert out == format_text(report)


def test_top_json_traceback_and_cumulative(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "a.hwdump", traces_for(app, 3))
    status, out, _ = run(capsys, "top", path, "--json", "--key-type", "traceback")
    assert status == 0
    data = json.loads(out)
    assert data["stats"][0]["traceback"] == [[app, 3], [app, 4]]
    assert data["stats"][0]["count"] == 3
    assert data["meta"]["pid"] == 4242
    assert data["meta"]["hostname"] == "web-1"
    assert data["total"] == {"size": 3 * 100_057 + 64 + 512 + 1024, "count": 6}

    status, out, _ = run(capsys, "top", path, "--cumulative", "--limit", "2")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "Top 2 lines (cumulative)"
    # ties sort by traceback, biggest first, as in the stdlib
    assert f"#1: {app}:4: 293.1 KiB" in lines
    assert f"#2: {app}:3: 293.1 KiB" in lines
    # each leaking block counts under both of its frames; the total does not
    assert out.splitlines()[-1] == "Total allocated size: 294.7 KiB"

    status, out, _ = run(capsys, "top", path, "--key-type", "filename", "--limit", "1")
    assert out.splitlines()[1] == f"#1: {app}: 293.2 KiB"  # with app.py:1


ROUTES = {7: "/items/{id}", 8: "/users/{uid}"}


def routed_dump(app: str, path: Path, leaks: int, *, first_route: int = 8) -> str:
    """A dump of traces_for(app, leaks) whose leaking blocks are /items/{id}'s
    but the first, ``first_route``'s; the rest of no route."""
    routed = [(trace, 7 if trace[1] == 100_057 else 0) for trace in traces_for(app, leaks)]
    routed[0] = (routed[0][0], first_route)
    header = DumpHeader("3.11.7", 4242, 1_700_000_000.0, "exact", 0, 2)
    write_dump(str(path), header, routed, routes=ROUTES)
    return str(path)


def test_top_by_route_of_a_dump_with_routes(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a dump whose one line is reached from two routes and outside any
    path = routed_dump(app, tmp_path / "r.hwdump", 3)
    # When its top is by route
    status, out, err = run(capsys, "top", path, "--key-type", "route")
    assert (status, err) == (0, "")
    assert out == (
        "Top 10 routes\n"
        "#1: /items/{id}: 195.4 KiB\n"
        "#2: /users/{uid}: 97.7 KiB\n"
        "#3: <none>: 1.6 KiB\n"
        "Total allocated size: 294.7 KiB\n"
    )
    status, out, _ = run(capsys, "top", path, "--key-type", "route", "--json")
    stats = json.loads(out)["stats"]
    assert stats[0] == {"rank": 1, "route": "/items/{id}", "size": 2 * 100_057, "count": 2}
    # and a dump without routes holds only <none>'s memory
    plain = dump(tmp_path / "a.hwdump", traces_for(app, 3))
    status, out, _ = run(capsys, "top", plain, "--key-type", "route")
    assert out.splitlines()[1:] == ["#1: <none>: 294.7 KiB", "Total allocated size: 294.7 KiB"]


def test_diff_by_route_of_two_dumps_with_routes(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given two dumps of a service: between them /items/{id} kept two more
    # blocks and /users/{uid} let its one go
    old = routed_dump(app, tmp_path / "old.hwdump", 2)
    new = routed_dump(app, tmp_path / "new.hwdump", 3, first_route=7)
    # When they are compared by route
    status, out, err = run(capsys, "diff", old, new, "--key-type", "route", "--json")
    # Then each route's change is its own
    assert (status, err) == (0, "")
    stats = {row["route"]: row for row in json.loads(out)["stats"]}
    assert stats["/items/{id}"]["size_diff"] == 2 * 100_057
    assert stats["/users/{uid}"]["size_diff"] == -100_057
    assert stats["<none>"]["size_diff"] == 0
    status, out, _ = run(capsys, "diff", old, new, "--key-type", "route")
    assert "Top 10 differences (routes)" in out, out
    assert "#1: /items/{id}: 293.1 KiB (+195.4 KiB)" in out, out


def test_top_of_a_sampled_dump_says_it_shows_estimates(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "s.hwdump", traces_for(app, 2), mode="sample", sample_interval=INTERVAL)
    status, out, _ = run(capsys, "top", path, "--json")
    assert status == 0
    data = json.loads(out)
    assert data["estimates"] is True
    # the estimates are heapwatch.tracemalloc's, hence the C core's
    expected = hw_tm.Snapshot.load(path).statistics("lineno")[0]
    assert (data["stats"][0]["size"], data["stats"][0]["count"]) == (expected.size, expected.count)
    _, out, _ = run(capsys, "top", path)
    assert out.startswith("# sample mode: sizes and counts are estimates (one sample per 64.0 KiB")


def test_diff_shows_what_grew_between_two_dumps(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = dump(tmp_path / "old.hwdump", traces_for(app, 1))
    new = dump(tmp_path / "new.hwdump", traces_for(app, 4), later=60)
    status, out, err = run(capsys, "diff", old, new, "--limit", "1")
    assert (status, err) == (0, "")
    assert out == (
        f"# from {old} (2023-11-14 22:13:20 UTC)\n"
        f"# to {new} (2023-11-14 22:14:20 UTC)\n"
        "Top 1 differences (lines)\n"
        f"#1: {app}:3: 390.8 KiB (+293.1 KiB)\n"
        "    leak.append(bytearray(100_000))  # LEAK\n"
        "3 other: 1.6 KiB (+0.0 KiB)\n"
        "Total allocated size: 392.4 KiB (+293.1 KiB)\n"
    )
    status, out, _ = run(capsys, "diff", old, new, "--json")
    assert json.loads(out)["stats"][0]["count_diff"] == 3


def test_convert_to_tracemalloc_loads_in_the_stdlib(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "a.hwdump", traces_for(app, 3))
    out = tmp_path / "a.pickle"
    assert run(capsys, "convert", path, "--to", "tracemalloc", "-o", str(out))[0] == 0
    loaded = stdlib_tm.Snapshot.load(str(out))
    assert isinstance(loaded, stdlib_tm.Snapshot)
    assert loaded.traceback_limit == 2
    ours = hw_tm.Snapshot.load(path)
    for key in ("lineno", "filename", "traceback"):
        assert [str(s) for s in loaded.statistics(key)] == [str(s) for s in ours.statistics(key)]


def test_convert_a_sampled_dump_to_tracemalloc_keeps_the_size_estimates(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "s.hwdump", traces_for(app, 2), mode="sample", sample_interval=INTERVAL)
    out = tmp_path / "s.pickle"
    status, _, err = run(capsys, "convert", path, "--to", "tracemalloc", "-o", str(out))
    assert status == 0
    assert "sizes are heapwatch's estimates, counts are numbers of samples" in err
    loaded = stdlib_tm.Snapshot.load(str(out)).statistics("lineno")
    ours = hw_tm.Snapshot.load(path).statistics("lineno")
    assert [(str(s.traceback), s.size) for s in loaded] == [
        (str(s.traceback), s.size) for s in ours
    ]


def test_convert_to_pprof(app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = dump(tmp_path / "s.hwdump", traces_for(app, 2), mode="sample", sample_interval=INTERVAL)
    out = tmp_path / "heap.pb.gz"
    assert run(capsys, "convert", path, "--to", "pprof", "-o", str(out))[0] == 0
    profile = decode_profile(out.read_bytes())
    strings = profile["string_table"]
    assert [strings[t["type"]] for t in profile["sample_type"]] == ["inuse_objects", "inuse_space"]
    assert profile["period"] == INTERVAL
    assert profile["time_nanos"] == 1_700_000_000 * 10**9
    expected = hw_tm.Snapshot.load(path).statistics("traceback")
    assert sorted(s["value"][1] for s in profile["sample"]) == sorted(s.size for s in expected)
    assert f"{app}:3" in strings  # a frame's function is named after its line
    assert gzip.decompress(out.read_bytes())  # gzip, as pprof wants it on disk


def test_convert_to_pprof_labels_each_sample_with_its_route(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a dump whose one line is reached from two routes and outside any
    path = routed_dump(app, tmp_path / "r.hwdump", 3)
    # When it is converted for pprof
    out = tmp_path / "heap.pb.gz"
    assert run(capsys, "convert", path, "--to", "pprof", "-o", str(out))[0] == 0
    # Then each sample carries its route as the live profile's http.route
    # label, and the memory of no route carries none
    profile = decode_profile(out.read_bytes())
    strings = profile["string_table"]
    by_route: dict[str, int] = {}
    for sample in profile["sample"]:
        labels = {strings[label["key"]]: strings[label["str"]] for label in sample["label"]}
        route = labels.get(ROUTE_LABEL, "<none>")
        by_route[route] = by_route.get(route, 0) + sample["value"][1]
    assert by_route == {"/items/{id}": 2 * 100_057, "/users/{uid}": 100_057, "<none>": 1600}


def test_convert_a_trusted_stdlib_pickle_to_a_dump(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = [(0, 10, (("a.py", 2),), 1), (3, 20, (("b.py", 4), ("a.py", 1)), 5)]
    pickled = tmp_path / "stdlib.pickle"
    stdlib_tm.Snapshot(traces, 5).dump(str(pickled))
    out = tmp_path / "x.hwdump"
    status, _, err = run(capsys, "convert", str(pickled), "--to", "heapwatch", "-o", str(out))
    assert status == 1
    assert "--allow-pickle" in err
    assert not out.exists()
    assert (
        run(capsys, "convert", str(pickled), "--to", "heapwatch", "-o", str(out), "--allow-pickle")[
            0
        ]
        == 0
    )
    converted = read_dump(str(out))
    assert converted.traces == traces
    assert converted.header.traceback_limit == 5


def test_convert_to_stdout(app: str, tmp_path: Path) -> None:
    path = dump(tmp_path / "a.hwdump", traces_for(app, 1))
    done = subprocess.run(
        [sys.executable, "-m", "heapwatch", "convert", path, "--to", "tracemalloc", "-o", "-"],
        env=child_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(pickle.loads(done.stdout), stdlib_tm.Snapshot)


def child_env() -> dict[str, str]:
    """The environment of a Python that imports this heapwatch."""
    paths = {
        os.path.dirname(os.path.dirname(heapwatch.__file__)),
        os.path.dirname(os.path.dirname(heapwatch_exporters.__file__)),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEAPWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(sorted(paths))
    return env


def test_python_dash_m_heapwatch_top(app: str, tmp_path: Path) -> None:
    path = dump(tmp_path / "a.hwdump", traces_for(app, 1))
    done = subprocess.run(
        [sys.executable, "-m", "heapwatch", "top", path, "--limit", "1"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "Top 1 lines"


# ---- errors: one line on stderr, status 1 (bad input) or 2 (usage) -------------


def one_line_error(err: str, *parts: str) -> None:
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    for part in parts:
        assert part in err


def test_damaged_dumps_are_one_line_errors(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = Path(dump(tmp_path / "a.hwdump", traces_for(app, 3))).read_bytes()
    cases = {
        "truncated": data[: len(data) // 2],
        "flipped": data[:30] + bytes([data[30] ^ 0x10]) + data[31:],
        "empty": b"",
        "text": b"hello, world\n",
        "newer": data[:14] + b"\x09" + data[15:],
    }
    for name, content in cases.items():
        bad = tmp_path / f"{name}.hwdump"
        bad.write_bytes(content)
        for argv in (
            ["top", str(bad)],
            ["diff", str(bad), str(bad)],
            ["convert", str(bad), "--to", "pprof", "-o", str(tmp_path / "out")],
        ):
            status, _, err = run(capsys, *argv)
            assert status == 1, (name, argv)
            one_line_error(err, f"heapwatch {argv[0]}: ", str(bad))
        assert not (tmp_path / "out").exists()  # nothing written from bad input
    status, _, err = run(capsys, "top", str(tmp_path / "newer.hwdump"))
    assert "upgrade heapwatch" in err


def test_missing_files_and_directories_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for target in (tmp_path / "missing.hwdump", tmp_path):
        status, _, err = run(capsys, "top", str(target))
        assert status == 1
        one_line_error(err, str(target))


def test_pickles_need_allow_pickle_and_bad_ones_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.pickle"
    stdlib_tm.Snapshot([(0, 10, (("a.py", 2),), 1)], 1).dump(str(good))
    status, _, err = run(capsys, "top", str(good))
    assert status == 1
    one_line_error(err, "a pickle", "runs code from the file", "--allow-pickle")

    cases = {
        "truncated": good.read_bytes()[:-10],
        "not_a_snapshot": pickle.dumps({"hello": 1}, protocol=4),
        "bad_traces": pickle.dumps(stdlib_tm.Snapshot([("x", -1, (), 0)], 1), protocol=4),
    }
    messages = {
        "truncated": "cannot unpickle",
        "not_a_snapshot": "not a tracemalloc Snapshot",
        "bad_traces": "trace #0 is not (domain, size, frames, total_nframe)",
    }
    for name, content in cases.items():
        bad = tmp_path / f"{name}.pickle"
        bad.write_bytes(content)
        status, _, err = run(capsys, "top", str(bad), "--allow-pickle")
        assert status == 1, name
        one_line_error(err, messages[name])


@pytest.mark.parametrize(
    "argv",
    [
        ["top", "x", "--limit", "-1"],
        ["top", "x", "--limit", "many"],
        ["top", "x", "--key-type", "module"],
        ["top", "x", "--key-type", "traceback", "--cumulative"],
        ["top", "x", "--key-type", "route", "--cumulative"],
        ["diff", "x", "y", "--key-type", "route", "--cumulative"],
        ["diff", "x"],
        ["convert", "x", "-o", "y"],
        ["convert", "x", "--to", "png", "-o", "y"],
    ],
)
def test_usage_errors_exit_with_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert "usage: heapwatch" in err
    assert "Traceback" not in err


def test_filenames_that_were_not_utf8_are_printed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "u.hwdump", [(0, 10, (("/srv/\udcff.py", 1),), 1)])
    status, out, err = run(capsys, "top", path)
    assert (status, err) == (0, "")
    assert "/srv/\\udcff.py:1" in out


@settings(
    max_examples=int(os.environ.get("HEAPWATCH_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.data(),
    st.sampled_from([["top"], ["top", "--key-type", "traceback"], ["diff-self"], ["pprof"]]),
)
def test_any_damage_is_a_clean_exit_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject, command: list[str]
) -> None:
    # Given a valid dump with some bytes changed, cut or appended
    original = Path(tmp_path / "base.hwdump")
    if not original.exists():
        dump(original, traces_for("/srv/app.py", 3))
    content = bytearray(original.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(content) - 1))
        content[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(content))))
    damaged = bytes(content[:cut]) if cut is not None else bytes(content)
    target = tmp_path / "damaged.hwdump"
    target.write_bytes(damaged)
    # When a command reads it
    if command == ["diff-self"]:
        argv = ["diff", str(original), str(target)]
    elif command == ["pprof"]:
        argv = ["convert", str(target), "--to", "pprof", "-o", str(tmp_path / "o.pb.gz")]
    else:
        argv = [command[0], str(target), *command[1:]]
    status, _, err = run(capsys, *argv)
    # Then it succeeds or says what is wrong in one line
    assert status in (0, 1)
    if status == 1:
        one_line_error(err)


def test_convert_into_a_directory_names_the_users_path(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path / "a.hwdump", traces_for(app, 3))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    missing = tmp_path / "no" / "such" / "out.pb.gz"
    for target, says in ((out_dir, "is a directory"), (missing, "No such file or directory")):
        status, _, err = run(capsys, "convert", path, "--to", "pprof", "-o", str(target))
        assert status == 1
        one_line_error(err, f"heapwatch convert: {target}: ", says)
        assert ".heapwatch-" not in err and ".tmp" not in err
    assert os.listdir(out_dir) == []


def test_a_refused_decompression_is_lifted_by_the_option_the_message_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_formats_dump import bomb

    from heapwatch.formats.dump import reader

    monkeypatch.setattr(reader, "_INFLATE_ALLOWANCE", 1 << 16)
    path = tmp_path / "bomb.hwdump"
    path.write_bytes(bomb(300_000))
    # Refused, with advice the command line can follow
    status, _, err = run(capsys, "top", str(path))
    assert status == 1
    one_line_error(err, "decompression bomb", "--max-inflate-ratio")
    # which it can
    status, out, err = run(capsys, "top", str(path), "--max-inflate-ratio", "2000")
    assert (status, err) == (0, "")
    assert out.startswith("Top 10 lines")
    for command in (["diff", str(path), str(path)], ["convert", str(path), "--to", "pprof"]):
        extra = ["-o", str(tmp_path / "out")] if command[0] == "convert" else []
        status, _, err = run(capsys, *command, *extra, "--max-inflate-ratio", "2000")
        assert (status, err) == (0, ""), command


@pytest.mark.parametrize("ratio", ["0", "0.5", "x", "nan"])
def test_a_bad_inflate_ratio_is_a_usage_error(
    ratio: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "top", "x", "--max-inflate-ratio", ratio)
    assert status == 2
    assert f"--max-inflate-ratio: expected a number of at least 1, got {ratio!r}" in err
