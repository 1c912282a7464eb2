"""A run holds no credential of the daemon's, through ``triggerer run``: its inlet events come
from the daemon over a socket of the run's own, and neither its spec, its folder, its log nor
its environment holds the database password or an API token."""

from __future__ import annotations

import json
import stat
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import make_url

from tests.e2e.daemon import ORDERS, events_of, runs

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.conftest import MakeDeployment

PASSWORD = "pw-3c1d9a7e"  # noqa: S105 - what the test looks for (PostgreSQL here trusts loopback)
TOKEN = "token-5b0e2f64"  # noqa: S105 - likewise

READER = """
    import json, os
    from pathlib import Path

    @pipeline(schedule=orders, inlets=[orders], outlets=[Asset("report")])
    def reader(spark, context):
        # What the run can see of the daemon's: its spec (while it runs) and its environment.
        spec = Path({logs!r}, "reader", context.run_id, "spec.json")
        Path({seen!r}).write_text(json.dumps({{
            "spec": spec.read_text(),
            "spec_mode": oct(spec.stat().st_mode & 0o777),
            "environ": dict(os.environ),
        }}))
        inlets = context.inlet_events[orders]
        context.outlet_events[Asset("report")].extra = {{
            "inlet_ids": [event.id for event in inlets]
        }}
"""


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
@pytest.mark.timeout(240)
async def test_a_run_reads_its_inlets_without_the_database_password(
    make_deployment: MakeDeployment, database_url: str, tmp_path: Path
) -> None:
    url = make_url(database_url).set(password=PASSWORD).render_as_string(hide_password=False)
    deployment = await make_deployment(url)
    seen, logs = tmp_path / "seen.json", tmp_path / "logs"
    deployment.write_pipelines(
        ORDERS + READER.replace("{logs!r}", repr(str(logs))).replace("{seen!r}", repr(str(seen)))
    )
    # The credentials come the way a service manager or a container hands them over.
    with deployment.process(
        TRIGGERER_API__ENABLED="true", TRIGGERER_API__PORT="0", TRIGGERER_API__TOKENS=TOKEN
    ) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce([{"n": 1}, {"n": 2}])
        [run] = await deployment.wait_for(
            runs, lambda rows: [r.state for r in rows] in (["success"], ["failed"])
        )
    assert run.state == "success", f"{run.error}{daemon.tail()}"

    [report] = await deployment.query(lambda session: events_of(session, "report"))
    orders = await deployment.query(lambda session: events_of(session, "orders"))
    assert report.extra["inlet_ids"] == [event.id for event in orders]
    assert len(report.extra["inlet_ids"]) >= 1  # the triggering message's event at least

    what_the_run_saw = json.loads(seen.read_text())
    assert what_the_run_saw["spec_mode"] == oct(stat.S_IRUSR | stat.S_IWUSR)
    for secret in (PASSWORD, TOKEN):
        assert secret not in what_the_run_saw["spec"]
        assert secret not in json.dumps(what_the_run_saw["environ"])
        for path in (logs / "reader").rglob("*.*"):  # its log, its result; the spec is gone
            assert secret not in path.read_text(errors="replace"), path
    assert not list((logs / "reader").rglob("spec.json"))
