"""Retention's pure parts: the cut-offs of ``[retention]`` and where a run's logs are."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from triggerer.service.config import RetentionSettings
from triggerer.service.daemon.retention import Cutoffs, log_folders

NOW = dt.datetime(2026, 3, 31, 12, tzinfo=dt.UTC)


def test_each_kind_is_cut_off_its_own_days_ago() -> None:
    settings = RetentionSettings(events_days=7, runs_days=30, dead_letters_days=90, audit_days=180)

    cutoffs = Cutoffs.of(settings, NOW)

    assert cutoffs == Cutoffs(
        events=NOW - dt.timedelta(days=7),
        runs=NOW - dt.timedelta(days=30),
        dead_letters=NOW - dt.timedelta(days=90),
        audit=NOW - dt.timedelta(days=180),
    )
    assert cutoffs.any


def test_zero_days_keeps_that_kind_for_ever() -> None:
    cutoffs = Cutoffs.of(RetentionSettings(events_days=0, dead_letters_days=0, audit_days=0), NOW)

    assert cutoffs == Cutoffs(runs=NOW - dt.timedelta(days=30))
    assert not Cutoffs.of(
        RetentionSettings(events_days=0, runs_days=0, dead_letters_days=0, audit_days=0), NOW
    ).any
    assert Cutoffs.of(
        RetentionSettings(events_days=0, runs_days=0, dead_letters_days=0), NOW
    ).any, "the audit log is kept a year by default"


def test_the_defaults_keep_a_month_and_the_audit_log_a_year() -> None:
    month_ago = NOW - dt.timedelta(days=30)
    year_ago = NOW - dt.timedelta(days=365)

    assert Cutoffs.of(RetentionSettings(), NOW) == Cutoffs(
        month_ago, month_ago, month_ago, year_ago
    )
    assert Cutoffs.before(month_ago) == Cutoffs(month_ago, month_ago, month_ago, month_ago)


def test_a_runs_log_folder_is_where_the_launcher_makes_it() -> None:
    logs = Path("/var/logs")

    assert log_folders(logs, "report", "report__asset__1", None) == {
        logs / "report" / "report__asset__1"
    }
    # Written under another logs_dir, before it was changed: that folder goes too.
    assert log_folders(
        logs, "report", "report__asset__1", "/old/report/report__asset__1/try-2.log"
    ) == {
        logs / "report" / "report__asset__1",
        Path("/old/report/report__asset__1"),
    }
    # A log file somewhere else is no folder of this run's to delete.
    assert log_folders(logs, "report", "r1", "/srv/elsewhere/try-1.log") == {logs / "report" / "r1"}


@pytest.mark.parametrize(
    ("pipeline_id", "run_id"),
    [("report", ".."), ("..", "r1"), ("report", "a/b"), ("", "r1"), ("report", ".")],
)
def test_an_id_that_is_no_plain_folder_name_gives_no_folder(pipeline_id: str, run_id: str) -> None:
    assert (
        log_folders(Path("/var/logs"), pipeline_id, run_id, f"/var/logs/x/{run_id}/t.log") == set()
    )
