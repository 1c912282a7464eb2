"""``triggerer explain``: why a pipeline has or has not run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triggerer.service.cli.output import say
from triggerer.service.cli.store import with_session
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse

    from triggerer.service.config import Settings
    from triggerer.service.reads.explain import Explanation


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verb(verbs, "explain", _explain, "why a pipeline has or has not run", reads=True).add_argument(
        "pipeline_id"
    )


async def _explain(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.service.reads.explain import explain

    explained = await with_session(
        settings, lambda session: explain(session, arguments.pipeline_id)
    )
    say(_explanation_text(explained))
    return 0


def _explanation_text(explained: Explanation) -> str:
    lines = [f"{explained.pipeline_id}: schedule {explained.schedule}"]
    for state in explained.assets:
        what = f"alias {state.name}" if state.alias else state.uri
        queued = (
            f"{state.queued_events} queued event(s) since {state.queued_since}"
            if state.queued_events
            else "no queued event: waiting"
        )
        lines.append(f"  {what}: {queued}")
    lines.append(f"  active runs: {explained.active_runs} of max {explained.max_active_runs}")
    if explained.last_run is not None:
        last = explained.last_run
        lines.append(f"  last run: {last.run_id} ({last.state}, created {last.created_at})")
    lines.extend(f"  {reason}" for reason in explained.reasons)
    return "\n".join(lines)
