"""Loading a pipelines folder: definitions collected, errors reported per file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.pipeline_files import write_file
from triggerer import Asset, AssetAlias
from triggerer.service.loader import (
    TRACEBACK_FRAMES,
    LoadError,
    PipelinesFolder,
    load_paths,
    load_pipelines,
)

PIPELINE = """
from triggerer import Asset, pipeline

orders = Asset("orders")

@pipeline(pipeline_id={pid!r}, schedule=orders, outlets=[Asset({out!r})])
def job(spark, context):
    pass
"""


pytestmark = pytest.mark.usefixtures("isolated_imports")


def test_folder_with_good_files(tmp_path: Path) -> None:
    first = write_file(tmp_path, "a.py", PIPELINE.format(pid="first", out="first_out"))
    second = write_file(tmp_path, "b.py", PIPELINE.format(pid="second", out="second_out"))
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert sorted(result.pipelines) == ["first", "second"]
    assert result.pipelines["first"].fileloc == str(first)
    assert result.pipelines["second"].fileloc == str(second)
    assert set(result.assets) == {Asset("orders"), Asset("first_out"), Asset("second_out")}


def test_syntax_error_is_reported_with_path_and_line(tmp_path: Path) -> None:
    write_file(tmp_path, "good.py", PIPELINE.format(pid="good", out="out"))
    bad = write_file(tmp_path, "bad.py", "x = 1\n\ndef broken(:\n    pass\n")
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["good"]
    assert len(result.errors) == 1
    error = result.errors[0]
    assert (error.path, error.line) == (str(bad), 3)
    assert error.message.startswith("SyntaxError")
    assert str(error).startswith(f"{bad}:3: SyntaxError")


def test_module_level_raise_is_reported_with_its_line(tmp_path: Path) -> None:
    bad = write_file(tmp_path, "bad.py", "x = 1\n\nraise ValueError('bad setting')\n")
    result = load_pipelines(tmp_path)
    assert result.errors == [LoadError(str(bad), 3, "ValueError: bad setting")]
    assert str(result.errors[0]) == f"{bad}:3: ValueError: bad setting"


def test_file_raising_at_import_is_reported_with_its_line(tmp_path: Path) -> None:
    write_file(tmp_path, "good.py", PIPELINE.format(pid="good", out="out"))
    bad = write_file(
        tmp_path,
        "bad.py",
        """\
        import json

        def helper():
            raise RuntimeError("no config")

        value = 1
        helper()
        """,
    )
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["good"]
    # The innermost frame in the file itself: where the exception was raised.
    assert result.errors == [LoadError(str(bad), 4, "RuntimeError: no config")]


def test_file_that_exits_at_import_is_reported_and_the_others_load(tmp_path: Path) -> None:
    write_file(tmp_path, "good.py", PIPELINE.format(pid="good", out="out"))
    script = write_file(tmp_path, "script.py", "import sys\n\nsys.exit()\n")
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["good"]
    assert [(e.path, e.line) for e in result.errors] == [(str(script), 3)]
    assert result.errors[0].message.startswith("the file called exit(None) while being imported")


def test_interrupt_while_importing_a_file_is_not_swallowed(tmp_path: Path) -> None:
    write_file(tmp_path, "slow.py", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_pipelines(tmp_path)


def test_error_in_an_imported_helper_points_at_the_line_in_the_file(tmp_path: Path) -> None:
    write_file(tmp_path, "_helpers.py", "def fail():\n    raise KeyError('missing')\n")
    bad = write_file(tmp_path, "job.py", "import _helpers\n\n_helpers.fail()\n")
    result = load_pipelines(tmp_path)
    assert len(result.errors) == 1
    assert (result.errors[0].path, result.errors[0].line) == (str(bad), 3)
    assert "KeyError" in result.errors[0].message


def test_a_bad_window_is_reported_with_the_file_and_line_that_gave_it(tmp_path: Path) -> None:
    write_file(tmp_path, "good.py", PIPELINE.format(pid="good", out="out"))
    bad = write_file(
        tmp_path,
        "windowed.py",
        """\
        from datetime import timedelta
        from triggerer import Asset, pipeline

        both = (Asset("orders") & Asset("customers")).within(timedelta(0))

        @pipeline(schedule=both)
        def job(spark, context):
            pass
        """,
    )
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["good"]
    assert result.errors == [
        LoadError(
            str(bad),
            4,
            "ValueError: orders & customers: within=datetime.timedelta(0) must be a positive "
            "timedelta, e.g. within=timedelta(hours=2)",
        )
    ]


NAME_ERROR = "x = 1\n\nspark_conf.get('x')\n"
RAISES_IN_FUNCTION = "def setup():\n    raise KeyError('conf')\n\nsetup()\n"
EXITS = "import sys\n\nsys.exit(2)\n"


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
@pytest.mark.parametrize(
    ("source", "line", "message"),
    [
        (NAME_ERROR, 3, "NameError: name 'spark_conf' is not defined"),
        (RAISES_IN_FUNCTION, 2, "KeyError: 'conf'"),
        (EXITS, 3, "the file called exit(2) while being imported"),
        ("x = 1\n\ndef broken(:\n    pass\n", 3, "SyntaxError: invalid syntax"),
    ],
    ids=["name_error", "in_function", "exit", "syntax_error"],
)
def test_error_keeps_its_line_in_a_relative_folder_as_in_an_absolute_one(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    relative: bool,
    source: str,
    line: int,
    message: str,
) -> None:
    """Was: line None with a relative folder (the demo's ``config/pipelines``): the frames
    name the file by its absolute path, which was compared with the relative one."""
    monkeypatch.chdir(tmp_path)
    folder = Path("config/pipelines") if relative else tmp_path / "config" / "pipelines"
    bad = write_file(folder, "bad.py", source)
    (error,) = load_pipelines(folder).errors
    assert (error.path, error.line) == (str(bad), line)
    assert error.message.startswith(message)
    assert error.traceback is not None
    assert f'"{(tmp_path / "config" / "pipelines" / "bad.py")}", line {line}' in error.traceback


def test_traceback_keeps_the_last_frames_from_the_file_on(tmp_path: Path) -> None:
    bad = write_file(
        tmp_path,
        "deep.py",
        """\
        import json

        def nested(depth):
            if depth:
                return nested(depth - 1)
            return json.loads("{")

        nested(20)
        """,
    )
    (error,) = load_pipelines(tmp_path).errors
    assert (error.line, error.message.split(":")[0]) == (6, "JSONDecodeError")
    assert error.traceback is not None
    lines = error.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    # The module and 21 calls of nested in the file, then json's own frames.
    assert lines[1].startswith("  ... ")
    assert lines[1].endswith(" earlier frames not shown")
    frames = [line for line in lines if line.startswith('  File "')]
    # Repeated frames are folded as Python folds them: at most TRACEBACK_FRAMES are shown.
    assert len(frames) <= TRACEBACK_FRAMES
    assert f'  File "{bad}", line 6, in nested' in frames
    assert "json" in frames[-1]
    assert lines[-1].startswith("json.decoder.JSONDecodeError: Expecting property name")
    # Nothing of the loader's or importlib's own frames before the file's.
    assert "importlib" not in error.traceback
    assert "loader.py" not in error.traceback


def test_traceback_of_a_module_level_error_starts_at_the_file(tmp_path: Path) -> None:
    bad = write_file(tmp_path, "bad.py", NAME_ERROR)
    (error,) = load_pipelines(tmp_path).errors
    assert error.traceback == (
        "Traceback (most recent call last):\n"
        f'  File "{bad}", line 3, in <module>\n'
        "    spark_conf.get('x')\n"
        "    ^^^^^^^^^^\n"
        "NameError: name 'spark_conf' is not defined\n"
    )


def test_syntax_error_in_an_imported_module_is_reported_at_the_import(tmp_path: Path) -> None:
    """Was: the module's line, given as the line of the file that imports it."""
    helper = write_file(tmp_path, "_helpers.py", "x = 1\ny = 2\n\ndef f(:\n    pass\n")
    bad = write_file(tmp_path, "job.py", "import os\nimport _helpers\n")
    (error,) = load_pipelines(tmp_path).errors
    assert (error.path, error.line) == (str(bad), 2)
    assert error.message == f"SyntaxError in {helper}, line 4: invalid syntax"
    assert error.traceback is not None
    assert f'File "{bad}", line 2, in <module>' in error.traceback
    assert f'File "{helper}", line 4' in error.traceback


def test_indentation_error_is_named_so(tmp_path: Path) -> None:
    bad = write_file(tmp_path, "bad.py", "def f():\nreturn 1\n")
    (error,) = load_pipelines(tmp_path).errors
    assert (error.path, error.line) == (str(bad), 2)
    assert error.message.startswith("IndentationError: expected an indented block")


def test_duplicate_pipeline_id_names_both_files_and_keeps_the_first(tmp_path: Path) -> None:
    first = write_file(tmp_path, "a.py", PIPELINE.format(pid="dup", out="from_a"))
    second = write_file(tmp_path, "b.py", PIPELINE.format(pid="dup", out="from_b"))
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["dup"]
    assert result.pipelines["dup"].fileloc == str(first)
    assert result.pipelines["dup"].outlets == (Asset("from_a"),)
    assert len(result.errors) == 1
    message = str(result.errors[0])
    assert str(first) in message
    assert str(second) in message
    assert "'dup'" in message


def test_pipeline_reexported_into_another_file_is_not_a_duplicate(tmp_path: Path) -> None:
    first = write_file(tmp_path, "a.py", PIPELINE.format(pid="shared", out="out"))
    write_file(tmp_path, "b.py", "from a import job\n")
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert result.pipelines["shared"].fileloc == str(first)


def test_same_pipeline_object_seen_twice_is_not_a_duplicate(tmp_path: Path) -> None:
    write_file(tmp_path, "a.py", PIPELINE.format(pid="once", out="out") + "\nalso = job\n")
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert list(result.pipelines) == ["once"]


def test_module_level_assets_aliases_and_watchers_are_collected(tmp_path: Path) -> None:
    write_file(
        tmp_path,
        "assets.py",
        """\
        from collections.abc import AsyncIterator
        from triggerer import Asset, AssetAlias, AssetWatcher, BaseEventTrigger, TriggerEvent

        class Trig(BaseEventTrigger):
            def serialize(self):
                return "x.Trig", {}

            async def run(self) -> AsyncIterator[TriggerEvent]:
                yield TriggerEvent({})

        watched = Asset("watched", watchers=[AssetWatcher("w1", Trig())])
        unused = Asset("standalone")
        alias = AssetAlias("by_alias")
        """,
    )
    write_file(
        tmp_path,
        "more.py",
        """\
        from triggerer import Asset, AssetWatcher
        import assets

        again = Asset("watched", watchers=[AssetWatcher("w2", assets.Trig())])
        """,
    )
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert set(result.assets) == {Asset("watched"), Asset("standalone")}
    assert [w.name for w in result.assets[Asset("watched")].watchers] == ["w1", "w2"]
    assert result.aliases == {AssetAlias("by_alias")}


def test_private_files_and_folders_are_skipped(tmp_path: Path) -> None:
    write_file(tmp_path, "_private.py", PIPELINE.format(pid="private_file", out="o1"))
    write_file(tmp_path, "_lib/job.py", PIPELINE.format(pid="private_dir", out="o2"))
    write_file(tmp_path, ".hidden/job.py", PIPELINE.format(pid="hidden_dir", out="o3"))
    write_file(tmp_path, "notes.txt", "not python")
    write_file(tmp_path, "main.py", PIPELINE.format(pid="main", out="o4"))
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert list(result.pipelines) == ["main"]


def test_plain_subfolders_are_loaded_and_same_stems_kept_apart(tmp_path: Path) -> None:
    write_file(tmp_path, "team_a/jobs.py", PIPELINE.format(pid="a_job", out="o1"))
    write_file(tmp_path, "team_b/jobs.py", PIPELINE.format(pid="b_job", out="o2"))
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert sorted(result.pipelines) == ["a_job", "b_job"]


def test_missing_folder_is_reported(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = load_pipelines(missing)
    assert result.pipelines == {}
    assert len(result.errors) == 1
    assert result.errors[0].path == str(missing)
    assert "does not exist" in result.errors[0].message


def test_empty_folder_loads_nothing(tmp_path: Path) -> None:
    result = load_pipelines(tmp_path)
    assert (result.pipelines, result.assets, result.errors) == ({}, {}, [])


def _scandir_failing(monkeypatch: pytest.MonkeyPatch, folder: Path, error: OSError) -> None:
    """``os.scandir`` of ``folder`` raises ``error`` (as root, no folder is unreadable)."""
    scandir = os.scandir

    def failing(path: os.PathLike[str] | str) -> Any:
        if Path(path) == folder:
            raise error
        return scandir(path)

    monkeypatch.setattr(os, "scandir", failing)


def test_folder_that_cannot_be_listed_is_reported_and_the_others_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: its pipelines were dropped without a word."""
    write_file(tmp_path, "good.py", PIPELINE.format(pid="good", out="out"))
    write_file(tmp_path, "team/job.py", PIPELINE.format(pid="job", out="job_out"))
    locked = tmp_path / "team"
    _scandir_failing(monkeypatch, locked, PermissionError(13, "Permission denied", str(locked)))
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["good"]
    assert result.errors == [
        LoadError(
            str(locked), None, f"cannot list the folder: [Errno 13] Permission denied: '{locked}'"
        )
    ]


def test_folder_removed_while_the_folder_is_walked_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: FileNotFoundError out of the walk, which ended the daemon during its folder scan."""
    write_file(tmp_path, "good.py", PIPELINE.format(pid="good", out="out"))
    write_file(tmp_path, "old/job.py", PIPELINE.format(pid="job", out="job_out"))
    gone = tmp_path / "old"
    _scandir_failing(monkeypatch, gone, FileNotFoundError(2, "No such file", str(gone)))
    result = load_pipelines(tmp_path)
    assert (list(result.pipelines), result.errors) == (["good"], [])


def test_a_folder_loaded_again_imports_only_the_files_that_changed(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        write_file(tmp_path, f"{name}.py", PIPELINE.format(pid=name, out=f"{name}_out"))
    folder = PipelinesFolder(tmp_path)
    imported: list[str] = []
    assert set(folder.load(lambda path: imported.append(path.stem)).pipelines) == {"a", "b", "c"}
    assert sorted(imported) == ["a", "b", "c"]

    imported.clear()
    write_file(tmp_path, "b.py", PIPELINE.format(pid="b2", out="b_out"))
    (tmp_path / "c.py").unlink()
    write_file(tmp_path, "d.py", "raise ValueError('broken')\n")
    loaded = folder.load(lambda path: imported.append(path.stem))

    assert sorted(imported) == ["b", "d"], "a is unchanged, c is gone"
    assert set(loaded.pipelines) == {"a", "b2"}
    assert [error.path for error in loaded.errors] == [str(tmp_path / "d.py")]
    imported.clear()
    assert [e.path for e in folder.load(lambda path: imported.append(path.stem)).errors] == [
        str(tmp_path / "d.py")
    ], "an unchanged broken file keeps its error without being imported again"
    assert imported == []


def test_watchers_merged_across_files_leave_each_files_assets_as_written(tmp_path: Path) -> None:
    """One asset declared in two files gets both files' watchers; a reload after one file
    dropped its watcher has only the other's (the merge is a copy, kept for no later load)."""
    trigger = """\
        from collections.abc import AsyncIterator
        from triggerer import Asset, AssetWatcher, BaseEventTrigger, TriggerEvent

        class Trig(BaseEventTrigger):
            def __init__(self, name):
                self.name = name

            def serialize(self):
                return "x.Trig", {{"name": self.name}}

            async def run(self) -> AsyncIterator[TriggerEvent]:
                yield TriggerEvent({{}})

        watched = Asset("watched", watchers=[{watchers}])
        """
    write_file(tmp_path, "a.py", trigger.format(watchers='AssetWatcher("w1", Trig("1"))'))
    write_file(tmp_path, "b.py", trigger.format(watchers='AssetWatcher("w2", Trig("2"))'))
    folder = PipelinesFolder(tmp_path)
    assert [w.name for w in folder.load().assets[Asset("watched")].watchers] == ["w1", "w2"]

    write_file(tmp_path, "b.py", trigger.format(watchers=""))
    os.utime(tmp_path / "b.py", ns=(1, 1))  # a changed stamp, whatever the clock's resolution
    assert [w.name for w in folder.load().assets[Asset("watched")].watchers] == ["w1"]


def test_duplicate_pipeline_id_names_both_lines(tmp_path: Path) -> None:
    first = write_file(tmp_path, "a.py", "\n" + PIPELINE.format(pid="dup", out="from_a"))
    second = write_file(tmp_path, "b.py", PIPELINE.format(pid="dup", out="from_b"))
    [error] = load_pipelines(tmp_path).errors
    assert (error.path, error.line) == (str(second), 6)
    assert error.message == (
        f"pipeline id 'dup' is already defined at {first}:7; ids must be unique "
        "(this definition is ignored)"
    )


def test_a_pipeline_hidden_by_a_second_definition_of_its_name_is_an_error(
    tmp_path: Path,
) -> None:
    path = write_file(
        tmp_path,
        "a.py",
        """
        from triggerer import pipeline

        @pipeline(pipeline_id="kept")
        def job(spark, context):
            pass

        @pipeline(pipeline_id="other")
        def other(spark, context):
            pass

        if True:
            def job():  # the name taken again: the pipeline "kept" would vanish
                return 1
        """,
    )
    result = load_pipelines(tmp_path)
    assert list(result.pipelines) == ["other"]
    assert [(e.path, e.line, e.message) for e in result.errors] == [
        (
            str(path),
            4,
            "pipeline 'kept' (line 4) is hidden: the name 'job' is defined again at line 13, "
            "so the file no longer holds the pipeline; give one of them another name",
        )
    ]


def test_a_pipeline_held_by_no_name_is_an_error(tmp_path: Path) -> None:
    path = write_file(
        tmp_path,
        "a.py",
        """
        from triggerer import Pipeline

        jobs = [Pipeline(f"job_{n}", application="job.py") for n in range(1)]
        """,
    )
    [error] = load_pipelines(tmp_path).errors
    assert (error.path, error.line) == (str(path), 4)
    assert error.message == (
        "pipeline 'job_0' made at line 4 is held by no module-level name, so it would not be "
        "loaded; assign it to one"
    )


def test_declared_pipelines_are_loaded_with_the_named_ones(tmp_path: Path) -> None:
    write_file(
        tmp_path,
        "a.py",
        """
        from triggerer import Pipeline
        from triggerer.pipelines import declare

        named = Pipeline("named", application="job.py")
        declare(named)  # already held: loaded once
        for n in range(2):
            declare(Pipeline(f"declared_{n}", application="job.py"))
        """,
    )
    result = load_pipelines(tmp_path)
    assert result.errors == []
    assert list(result.pipelines) == ["named", "declared_0", "declared_1"]


def test_a_watcher_whose_trigger_cannot_be_made_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write_file(
        tmp_path,
        "a.py",
        """
        from triggerer import Asset, AssetWatcher
        from watchers import MessageQueueTrigger

        orders = Asset(
            "orders",
            watchers=[AssetWatcher("orders_queue", MessageQueueTrigger("kafak://b:9092/t"))],
        )
        """,
    )
    result = load_pipelines(tmp_path)
    [error] = result.errors
    assert (error.path, error.line) == (str(path), 7)
    assert error.message.startswith(
        "watcher 'orders_queue' of asset 'orders': queue 'kafak://b:9092/t' has no supported "
        "scheme; supported: amqp,"
    )
    # The daemon still shows the watcher failed with the error, as before.
    assert [w.name for w in result.assets[Asset("orders")].watchers] == ["orders_queue"]


def test_load_paths_takes_files_and_folders_together(tmp_path: Path) -> None:
    one = write_file(tmp_path / "one", "a.py", PIPELINE.format(pid="dup", out="x"))
    two = write_file(tmp_path / "two", "b.py", PIPELINE.format(pid="dup", out="y"))
    write_file(tmp_path / "two", "c.py", PIPELINE.format(pid="c", out="z"))
    result = load_paths([tmp_path / "one", two, tmp_path / "missing"])
    assert list(result.pipelines) == ["dup"]
    assert result.pipelines["dup"].fileloc == str(one)
    assert [(e.path, e.line) for e in result.errors] == [
        (str(two), 6),
        (str(tmp_path / "missing"), None),
    ]
