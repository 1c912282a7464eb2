"""A store filled with a long history, for ``bench_large_store``: written straight into the
tables with the database's own bulk paths, not through the daemon.

The history of ``events`` events (ids 1..N), ``events / 10`` runs (ids 1..N/10) each consuming
ten consecutive events (one ``run_event`` link per event), and ``events / 1000`` dead letters,
spread over the last :data:`HISTORY_DAYS` days (newer than retention's default 30 days, so the
daemon's retention finds nothing to delete). Half the runs are of one hot pipeline
(:data:`HOT_PIPELINE`, on :data:`HOT_ASSET`), the other half spread over the 1,000 pipelines
``p0``..``p999`` (on ``s0``..``s999``); one run in 50 failed, the others succeeded; one event
of an ``s`` asset in ten was produced by a run. Every event is consumed, so the queue is empty.

PostgreSQL: ``INSERT ... SELECT`` over ``generate_series`` in chunks of :data:`CHUNK` rows,
foreign-key triggers off (``session_replication_role = replica``), the indexes that back no
constraint dropped first and created again after, then ``VACUUM ANALYZE``, as autovacuum would
have left a store that grew slowly. SQLite: the same over a recursive CTE, with ``synchronous``
and the journal off during the fill; no ``ANALYZE`` (the daemon never runs one).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from sqlalchemy import make_url

HISTORY_DAYS = 25
CHUNK = 1_000_000
SOURCE_PIPELINES = 1000
"""``p0``..``p999``, each scheduled on ``s<i> & t<i>``."""
HOT_PIPELINE = "on_order"
HOT_ASSET = "latency"
FILLED_TABLES = ("run", "asset_event", "run_event", "dead_letter")


def pipelines_source(bootstrap: str, ingest_topic: str, latency_topic: str, options: str) -> str:
    """The pipelines of the benchmark: ``consumer`` on ``[orders, never]`` (ingest: its events
    only queue), ``on_order`` a run per event of ``latency``, ``hold`` a manual run that keeps
    the launcher's slot, and ``p0``..``p999``."""
    lines = [
        "import time",
        "",
        "from triggerer import Asset, AssetWatcher, pipeline",
        "from watchers import KafkaTrigger",
        "",
        'orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(',
        f"    bootstrap_servers={bootstrap!r}, topics=[{ingest_topic!r}], {options}))])",
        'never = Asset("never")',
        f'latency = Asset("{HOT_ASSET}", watchers=[AssetWatcher("latency_topic", KafkaTrigger(',
        f"    bootstrap_servers={bootstrap!r}, topics=[{latency_topic!r}], {options},",
        "    fetch_max_wait_ms=10))])",
        "",
        "",
        "@pipeline(schedule=[orders, never])",
        "def consumer(spark, context):",
        "    raise AssertionError('never runs: the asset never gets no events')",
        "",
        "",
        '@pipeline(schedule=latency, run_policy="per_event", max_active_runs=100_000_000)',
        f"def {HOT_PIPELINE}(spark, context):",
        "    pass",
        "",
        "",
        "@pipeline(schedule=None)",
        "def hold(spark, context):",
        "    time.sleep(3600)",
    ]
    for n in range(SOURCE_PIPELINES):
        lines += [
            "",
            "",
            f'@pipeline(schedule=Asset("s{n}") & Asset("t{n}"))',
            f"def p{n}(spark, context):",
            "    pass",
        ]
    return "\n".join(lines) + "\n"


# -- the statements, per dialect


def _series(dialect: str) -> str:
    """Rows ``x`` from ``:first`` to ``:last``."""
    if dialect == "postgresql":
        return "generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g(x)"
    return (
        "(WITH RECURSIVE c(x) AS (SELECT :first UNION ALL SELECT x + 1 FROM c WHERE x < :last)"
        " SELECT x FROM c) AS g"
    )


def _at(dialect: str, seconds: str) -> str:
    """The time ``:base`` plus ``seconds`` (an SQL expression), as the column stores it."""
    if dialect == "postgresql":
        return f"(CAST(:base AS timestamptz) + ({seconds}) * interval '1 second')"
    # SQLAlchemy's SQLite DateTime text: 'YYYY-MM-DD HH:MM:SS.ffffff'.
    micros = f"CAST(({seconds}) * 1000000 AS INTEGER)"
    return (
        f"printf('%s.%06d', datetime(:base_epoch + {micros} / 1000000, 'unixepoch'),"
        f" {micros} % 1000000)"
    )


def _json(dialect: str, *pairs: str) -> str:
    function = "jsonb_build_object" if dialect == "postgresql" else "json_object"
    return f"{function}({', '.join(pairs)})"


def _pad(dialect: str, count: int) -> str:
    return f"repeat('x', {count})" if dialect == "postgresql" else f"printf('%.{count}c', 'x')"


def _true(dialect: str) -> str:
    return "true" if dialect == "postgresql" else "json('true')"


def _owner(run: str) -> str:
    """The ``fill_map`` key of run number ``run`` (1-based): every other run is the hot
    pipeline's (key :data:`SOURCE_PIPELINES`), the rest go round the source pipelines."""
    return (
        f"CASE WHEN ({run} - 1) % 2 = 0 THEN {SOURCE_PIPELINES}"
        f" ELSE (({run} - 1) / 2) % {SOURCE_PIPELINES} END"
    )


def statements(dialect: str) -> dict[str, str]:
    """The fill's INSERTs, bound with ``:first``, ``:last`` (the chunk), ``:base`` (or
    ``:base_epoch`` on SQLite), ``:step_s`` (seconds between events), ``:trigger_id``."""
    series = _series(dialect)
    run = "((x - 1) / 10 + 1)"  # the run that consumes event x
    created = _at(dialect, "(x - 1) * 10 * :step_s")
    started = _at(dialect, "(x - 1) * 10 * :step_s + 1")
    ended = _at(dialect, "(x - 1) * 10 * :step_s + 5")
    extra = _json(
        dialect,
        "'from_trigger'",
        _true(dialect),
        "'payload'",
        _json(
            dialect,
            "'topic'",
            "'history'",
            "'partition'",
            "0",
            "'offset'",
            "x",
            "'value'",
            _json(dialect, "'id'", "x", "'type'", "'order'", "'pad'", _pad(dialect, 180)),
        ),
    )
    hot = f"({_owner(run)}) = {SOURCE_PIPELINES}"
    produced = f"NOT {hot} AND x % 10 = 0 AND {run} > 1"
    empty = "'{}'"
    # S608 below: every part of these statements is this module's own text.
    return {
        "run": (
            "INSERT INTO run (id, run_id, pipeline_id, run_type, state, try_number,"  # noqa: S608
            " max_tries, params, created_at, start_date, end_date, error, rerun_of)"
            " SELECT x, m.pipeline_id || '__asset__' || ((x - 1) * 10 + 1), m.pipeline_id,"
            " 'asset', CASE WHEN x % 50 = 1 THEN 'failed' ELSE 'success' END, 1, 1,"
            f" {empty}, {created}, {started}, {ended},"
            " CASE WHEN x % 50 = 1 THEN 'the pipeline raised ValueError' END, NULL"
            f" FROM {series} JOIN fill_map m ON m.k = {_owner('x')}"
        ),
        "asset_event": (
            "INSERT INTO asset_event (id, asset_id, extra, source, source_trigger_id,"  # noqa: S608
            " source_run_pk, dedup_key, partition_key, timestamp)"
            f" SELECT x, m.asset_id, {extra},"
            f" CASE WHEN {hot} THEN 'trigger' WHEN {produced} THEN 'run' ELSE 'rest_api' END,"
            f" CASE WHEN {hot} THEN :trigger_id END,"
            f" CASE WHEN {produced} THEN {run} - 1 END,"
            f" CASE WHEN {hot} THEN 'history/0/' || x END, NULL,"
            f" {_at(dialect, '(x - 1) * :step_s')}"
            f" FROM {series} JOIN fill_map m ON m.k = {_owner(run)}"
        ),
        "run_event": (
            "INSERT INTO run_event (run_pk, event_id, pipeline_id, rerun)"  # noqa: S608
            f" SELECT {run}, x, m.pipeline_id, {'false' if dialect == 'postgresql' else '0'}"
            f" FROM {series} JOIN fill_map m ON m.k = {_owner(run)}"
        ),
        "dead_letter": (
            "INSERT INTO dead_letter (id, asset_id, trigger_id, source, dedup_key,"  # noqa: S608
            " partition_key, payload, reason, created_at)"
            " SELECT x, m.asset_id, NULL, 'rest_api', 'dead/' || x, NULL,"
            f" {_pad(dialect, 100)}, 'extra: PostgreSQL cannot store a NUL character',"
            f" {_at(dialect, '(x - 1) * 1000 * :step_s')}"
            f" FROM {series} JOIN fill_map m ON m.k = x % {SOURCE_PIPELINES}"
        ),
    }


# -- filling


class Filler:
    """Writes the history into a migrated store whose pipelines are synced: ``fill_map`` (a
    temporary table: key -> asset id, pipeline id) is built from ``mapping``."""

    def __init__(self, database_url: str, mapping: dict[int, tuple[int, str]], trigger_id: int):
        self.url = make_url(database_url)
        self.dialect = self.url.get_backend_name()
        self.mapping = mapping
        self.trigger_id = trigger_id
        self.seconds: dict[str, float] = {}
        """How long each step took."""

    def fill(self, events: int) -> dict[str, float]:
        """Write the history of ``events`` events; the seconds of each step."""
        step_s = HISTORY_DAYS * 86400 / max(1, events)
        base = dt.datetime.now(dt.UTC) - dt.timedelta(days=HISTORY_DAYS)
        sizes = {
            "run": events // 10,
            "asset_event": events,
            "run_event": events,
            "dead_letter": events // 1000,
        }
        with self._connection() as execute:
            indexes = self._timed("drop_indexes", lambda: self._drop_indexes(execute))
            execute(
                "CREATE TEMPORARY TABLE fill_map (k INTEGER PRIMARY KEY, asset_id INTEGER,"
                " pipeline_id TEXT)"
            )
            for key, (asset_id, pipeline_id) in self.mapping.items():
                execute(
                    "INSERT INTO fill_map VALUES (:k, :a, :p)",
                    {"k": key, "a": asset_id, "p": pipeline_id},
                )
            execute("COMMIT")
            for table, statement in statements(self.dialect).items():
                total = sizes[table]

                def insert(statement: str = statement, total: int = total) -> None:
                    for first in range(1, total + 1, CHUNK):
                        parameters = {
                            "first": first,
                            "last": min(total, first + CHUNK - 1),
                            "step_s": step_s,
                            "trigger_id": self.trigger_id,
                            "base": base,
                            "base_epoch": base.timestamp(),
                        }
                        execute(statement, parameters)
                        execute("COMMIT")

                self._timed(table, insert)
            self._timed("create_indexes", lambda: self._create_indexes(execute, indexes))
            self._timed("sequences_and_analyze", lambda: self._finish(execute))
        return {name: round(seconds, 1) for name, seconds in self.seconds.items()}

    def _timed(self, name: str, step: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = step()
        self.seconds[name] = time.perf_counter() - started
        return result

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Callable[..., Any]]:
        """``execute(sql, parameters)`` on one connection, named parameters (``:name``)."""
        if self.dialect == "postgresql":
            libpq = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
            with psycopg.connect(libpq, autocommit=True) as connection:
                connection.execute("SET session_replication_role = replica")
                connection.execute("SET synchronous_commit = off")
                connection.execute("SET maintenance_work_mem = '512MB'")
                connection.execute("BEGIN")

                def execute_pg(sql: str, parameters: dict[str, Any] | None = None) -> Any:
                    if sql in ("COMMIT", "VACUUM ANALYZE"):  # each outside a transaction
                        connection.execute("COMMIT")
                        if sql != "COMMIT":
                            connection.execute(sql)
                        connection.execute("BEGIN")
                        return []
                    if parameters:
                        sql = sql.replace("%", "%%")
                        for name in sorted(parameters, key=len, reverse=True):
                            sql = sql.replace(f":{name}", f"%({name})s")
                    cursor = connection.execute(sql.encode(), parameters)
                    return cursor.fetchall() if cursor.description else []

                yield execute_pg
                connection.execute("COMMIT")
            return
        path = self.url.database or ""
        lite = sqlite3.connect(path, isolation_level=None)
        try:
            lite.execute("PRAGMA synchronous=OFF")
            lite.execute("PRAGMA journal_mode=OFF")
            lite.execute("PRAGMA cache_size=-500000")
            lite.execute("BEGIN")

            def execute_sqlite(sql: str, parameters: dict[str, Any] | None = None) -> Any:
                if sql == "COMMIT":
                    lite.execute("COMMIT")
                    lite.execute("BEGIN")
                    return []
                return lite.execute(sql, parameters or {}).fetchall()

            yield execute_sqlite
            lite.execute("COMMIT")
            lite.execute("PRAGMA journal_mode=WAL")
        finally:
            lite.close()

    def _drop_indexes(self, execute: Callable[..., Any]) -> list[str]:
        """Drop the indexes of the filled tables that back no constraint; their definitions."""
        if self.dialect == "postgresql":
            rows = execute(
                "SELECT i.indexname, i.indexdef FROM pg_indexes i"
                " WHERE i.schemaname = current_schema() AND i.tablename = ANY(:tables)"
                " AND NOT EXISTS (SELECT 1 FROM pg_constraint c"
                " WHERE c.conname = i.indexname)",
                {"tables": list(FILLED_TABLES)},
            )
        else:
            names = ", ".join(f"'{table}'" for table in FILLED_TABLES)
            rows = execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index'"  # noqa: S608 - ours
                f" AND sql IS NOT NULL AND tbl_name IN ({names})"
            )
        for name, _ in rows:
            execute(f'DROP INDEX "{name}"')
        execute("COMMIT")
        return [definition for _, definition in rows]

    def _create_indexes(self, execute: Callable[..., Any], indexes: list[str]) -> None:
        for definition in indexes:
            execute(definition)
            execute("COMMIT")

    def _finish(self, execute: Callable[..., Any]) -> None:
        if self.dialect != "postgresql":
            return
        for table in ("run", "asset_event", "dead_letter"):
            execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"  # noqa: S608 - ours
                f" (SELECT coalesce(max(id), 0) + 1 FROM {table}), false)"
            )
        execute("COMMIT")
        execute("VACUUM ANALYZE")
