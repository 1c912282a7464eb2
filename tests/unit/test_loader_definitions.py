"""Which definitions a pipeline file holds, as the loader takes them: a DAG made as a helper
module is imported is an error of the file that imports it, every time it is loaded; two
pipelines of one id in one file are an error naming both lines, however they were made; a file
checked on its own imports as the daemon imports it from its folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pipeline_files import write_file
from triggerer.service.loader import LoadError, PipelinesFolder, load_paths, load_pipelines

ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the packages triggerer and watchers."""


pytestmark = pytest.mark.usefixtures("isolated_imports")


def _touch(path: Path) -> None:
    """A changed stamp, whatever the clock's resolution: the folder imports it again."""
    stamp = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


SHARED_DAG = """\
from airflow.sdk import DAG, task

with DAG("shared", schedule=None):
    @task
    def step():
        return 1

    step()
"""


def test_a_dag_made_as_a_helper_is_imported_is_an_error_each_time_the_file_loads(
    tmp_path: Path,
) -> None:
    """Was: the DAG loaded the first time only; once the helper was imported, a.py loaded
    again (after a change) had lost it, without a word, and so had b.py importing it too."""
    helper = write_file(tmp_path, "_shared.py", SHARED_DAG)
    first = write_file(tmp_path, "a.py", "from airflow.sdk import DAG\nimport _shared\n")
    second = write_file(
        tmp_path, "b.py", "from airflow.sdk import DAG\n\nfrom _shared import DAG\n"
    )
    message = (
        f"DAG 'shared' is made in helper module {helper}, line 3, as it is imported: make it "
        "in the pipeline file, or in a function the file calls (a module runs once, on its "
        "first import: this file loaded again would not have the DAG)"
    )
    folder = PipelinesFolder(tmp_path)
    for _ in range(2):
        loaded = folder.load()
        assert loaded.pipelines == {}
        assert loaded.errors == [
            LoadError(str(first), 2, message),
            LoadError(str(second), 3, message),
        ]
        _touch(first)
        _touch(second)


def test_a_dag_made_by_a_helpers_function_the_file_calls_loads_each_time(
    tmp_path: Path,
) -> None:
    write_file(
        tmp_path,
        "_factory.py",
        """\
        from airflow.sdk import DAG, task

        def make(dag_id):
            with DAG(dag_id, schedule=None):
                @task
                def step():
                    return 1

                step()
        """,
    )
    path = write_file(tmp_path, "a.py", "from airflow.sdk import DAG\nimport _factory\n\n")
    path.write_text(path.read_text() + '_factory.make("one")\n_factory.make("two")\n')
    folder = PipelinesFolder(tmp_path)
    for _ in range(2):
        loaded = folder.load()
        assert loaded.errors == []
        assert {p.pipeline_id: p.fileloc for p in loaded.pipelines.values()} == {
            "one": str(path),
            "two": str(path),
        }
        _touch(path)


def test_a_dag_of_another_pipeline_file_the_file_imports_is_that_files(tmp_path: Path) -> None:
    """Was: the DAG was a.py's (the first file to import b.py), not b.py's."""
    write_file(tmp_path, "a.py", "from airflow.sdk import DAG\nfrom b import LIMIT\n")
    own = write_file(tmp_path, "b.py", SHARED_DAG + "\nLIMIT = 5\n")
    loaded = load_pipelines(tmp_path)
    assert loaded.errors == []
    assert {p.pipeline_id: p.fileloc for p in loaded.pipelines.values()} == {"shared": str(own)}


def test_two_dags_of_one_id_made_in_a_loop_are_an_error(tmp_path: Path) -> None:
    """Was: the second dropped without a word (the same line and code as the first)."""
    path = write_file(
        tmp_path,
        "dags.py",
        """\
        from airflow.sdk import DAG, task

        for dag_id, schedule in [("sales", None), ("sales", "@daily")]:
            with DAG(dag_id, schedule=schedule):
                @task
                def step():
                    return 1

                step()
        """,
    )
    loaded = load_pipelines(tmp_path)
    assert list(loaded.pipelines) == ["sales"]
    assert loaded.errors == [
        LoadError(
            str(path),
            4,
            f"pipeline id 'sales' is already defined at {path}:4; ids must be unique (this "
            "definition is ignored)",
        )
    ]
    assert loaded.pipelines["sales"].cron is None, "the first is kept"


DAG_FACTORY = """\
from airflow.sdk import DAG, task

def make(dag_id, schedule):
    with DAG(dag_id, schedule=schedule):
        @task
        def step():
            return 1

        step()
"""
"""An Airflow factory of one-task DAGs: ``make(dag_id, schedule)``."""


def test_two_dags_of_one_id_from_a_factory_are_an_error_naming_both_calls(
    tmp_path: Path,
) -> None:
    """Was: the second dropped without a word (the same line and code as the first)."""
    calls = 'make("x", None)\nmake("x", "@daily")\n'
    path = write_file(tmp_path, "dags.py", f"{DAG_FACTORY}\n{calls}")
    loaded = load_pipelines(tmp_path)
    assert list(loaded.pipelines) == ["x"]
    assert loaded.pipelines["x"].cron is None, "the first is kept"
    assert loaded.errors == [
        LoadError(
            str(path),
            12,
            f"pipeline id 'x' is already defined at {path}:11; ids must be unique (this "
            "definition is ignored)",
        )
    ]


def test_two_pipelines_of_one_id_from_a_factory_are_an_error(tmp_path: Path) -> None:
    path = write_file(
        tmp_path,
        "jobs.py",
        """\
        from triggerer import pipeline

        def make(name):
            @pipeline(pipeline_id=name)
            def job(spark, context):
                pass

            return job

        daily = make("report")
        hourly = make("report")
        """,
    )
    loaded = load_pipelines(tmp_path)
    assert list(loaded.pipelines) == ["report"]
    assert [(e.path, e.line, e.message) for e in loaded.errors] == [
        (
            str(path),
            11,
            f"pipeline id 'report' is already defined at {path}:10; ids must be unique (this "
            "definition is ignored)",
        )
    ]


def test_a_helper_imported_from_the_configured_folder_loads_as_in_the_daemon(
    tmp_path: Path,
) -> None:
    """Was: a file of a subfolder checked on its own had its subfolder on the import path,
    where the daemon has the pipelines folder: ModuleNotFoundError for its helper."""
    folder = tmp_path / "pipelines"
    write_file(folder, "_common.py", "SCHEDULE = '@daily'\n")
    job = write_file(
        folder,
        "sub/job.py",
        """\
        from triggerer import pipeline
        import _common

        @pipeline(schedule=_common.SCHEDULE)
        def job(spark, context):
            pass
        """,
    )
    # Not under the configured folder (another one), a file has its own on the import path.
    [error] = load_paths([job], tmp_path / "elsewhere").errors
    assert error.message == "ModuleNotFoundError: No module named '_common'"
    for given in (job, folder / "sub"):
        loaded = load_paths([given], folder)
        assert (list(loaded.pipelines), loaded.errors) == (["job"], [])
    assert load_pipelines(folder).errors == []


CHECKED_THROUGH_A_LINK = """
import sys
from pathlib import Path

import triggerer
from triggerer.service.loader import load_pipelines

print(triggerer.__file__)
for error in load_pipelines(Path(sys.argv[1])).errors:
    print(error.line, error.message)
"""


def test_triggerer_imported_through_a_linked_folder_places_definitions(tmp_path: Path) -> None:
    """Was: triggerer's own frames were taken as the user's (they name the link, which was
    compared with the resolved folder), so each definition was made "in triggerer": a
    pipeline hidden by a second definition of its name vanished without a word."""
    link = tmp_path / "link"
    link.symlink_to(ROOT)
    write_file(
        tmp_path,
        "pipelines/jobs.py",
        """\
        from triggerer import pipeline

        @pipeline()
        def load(spark, context):
            pass

        def load(path):
            return path
        """,
    )
    env = {**os.environ, "PYTHONPATH": str(link)}
    done = subprocess.run(  # noqa: S603 - this interpreter, on a script of the test's
        [sys.executable, "-c", CHECKED_THROUGH_A_LINK, str(tmp_path / "pipelines")],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tmp_path,
    )
    assert done.stdout.splitlines() == [
        str(link / "triggerer" / "__init__.py"),
        "3 pipeline 'load' (line 3) is hidden: the name 'load' is defined again at line 7, so "
        "the file no longer holds the pipeline; give one of them another name",
    ]


def test_two_files_making_one_id_with_a_helpers_factory_are_an_error(tmp_path: Path) -> None:
    """Was: b.py's DAG dropped without a word (the same line and code as a.py's, as though
    b.py had imported a.py's)."""
    write_file(tmp_path, "_factory.py", DAG_FACTORY)
    imports = "from airflow.sdk import DAG\nimport _factory\n"
    first = write_file(tmp_path, "a.py", f'{imports}\n_factory.make("x", None)\n')
    second = write_file(tmp_path, "b.py", f'{imports}_factory.make("x", "@daily")\n')
    loaded = load_pipelines(tmp_path)
    assert loaded.pipelines["x"].fileloc == str(first)
    assert loaded.errors == [
        LoadError(
            str(second),
            3,
            f"pipeline id 'x' is already defined at {first}:4; ids must be unique (this "
            "definition is ignored)",
        )
    ]


def test_a_pipeline_imported_from_another_file_is_not_a_duplicate_either_way(
    tmp_path: Path,
) -> None:
    source = """\
        from triggerer import pipeline

        @pipeline()
        def job(spark, context):
            pass
        """
    own = write_file(tmp_path, "b.py", source)
    write_file(tmp_path, "a.py", "from b import job\n")  # loaded first: imports b.py
    write_file(tmp_path, "c.py", "from b import job\n")  # loaded last: b is imported already
    loaded = load_pipelines(tmp_path)
    assert loaded.errors == []
    assert loaded.pipelines["job"].fileloc == str(tmp_path / "a.py")
    # A file given twice to pipelines check is not two definitions either.
    loaded = load_paths([tmp_path, own])
    assert (list(loaded.pipelines), loaded.errors) == (["job"], [])
