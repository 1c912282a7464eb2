"""``FileTrigger``: new files in a folder become events.

This is also the worked example of a custom trigger (see docs/writing-a-trigger.md): a plain
subclass of ``BaseEventTrigger`` with its own ``__init__``, ``serialize`` and ``run``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog

from triggerer.triggers import Ack, BaseEventTrigger, SourceMissing, TriggerEvent

log = structlog.get_logger(__name__)

LEDGER_NAME = ".triggerer-done"


class FileTrigger(BaseEventTrigger):
    """Yield one event per new file in ``directory`` whose path matches the glob ``pattern``.

    The payload is ``{"path", "size", "mtime"}``. Acking the event records the file in the
    directory's ``.triggerer-done`` ledger: it is not yielded again, also after a restart, while
    a file that was yielded but never acked is yielded again after a restart. A file whose size
    or modification time changes counts as new. Names starting with ``.`` are skipped, so write
    a file under a hidden name and rename it once it is complete.
    """

    # The ledger is on this machine's disk: run on one daemon instance only.
    shareable = False

    def __init__(self, directory: str, pattern: str = "*", *, poll_interval_s: float = 5.0) -> None:
        if not pattern or Path(pattern).is_absolute():
            raise ValueError(
                f"FileTrigger pattern={pattern!r} must be a relative glob like '*.csv'"
            )
        if poll_interval_s <= 0:
            raise ValueError(f"FileTrigger poll_interval_s={poll_interval_s!r} must be above 0")
        self.directory = os.path.abspath(directory)
        self.pattern = pattern
        self.poll_interval_s = poll_interval_s
        self._ledger = Path(self.directory, LEDGER_NAME)
        self._done: set[str] = set()
        self._ledger_lock = asyncio.Lock()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {
            "directory": self.directory,
            "pattern": self.pattern,
            "poll_interval_s": self.poll_interval_s,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if not await asyncio.to_thread(os.path.isdir, self.directory):
            # SourceMissing: the daemon looks again every few seconds, as the folder may be
            # made by whatever writes its first file.
            raise SourceMissing(f"FileTrigger directory {self.directory!r} does not exist")
        self._done = await asyncio.to_thread(self._load_ledger)
        yielded: set[str] = set()  # not acked yet: yielded again only after a restart
        while True:
            files = await asyncio.to_thread(self._scan)
            self.polled()  # the watcher's last poll, also when nothing is new
            for key, payload in files.items():
                if key in self._done or key in yielded:
                    continue
                yielded.add(key)
                yield TriggerEvent(payload, dedup_key=key, ack=self._acker(key))
            # Forget files that are gone, so memory follows the directory, not its history.
            yielded &= files.keys()
            self._done &= files.keys()
            await asyncio.sleep(self.poll_interval_s)  # polling: portable, no inotify needed

    def _acker(self, key: str) -> Ack:
        async def ack() -> None:
            async with self._ledger_lock:
                await asyncio.to_thread(self._append_ledger, key)
            self._done.add(key)

        return ack

    def _scan(self) -> dict[str, dict[str, Any]]:
        """Dedup key -> payload for every matching visible file, oldest first."""
        found = []
        for path in Path(self.directory).glob(self.pattern):
            relative = path.relative_to(self.directory)
            if any(part.startswith(".") for part in relative.parts):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed since the listing
                continue
            if path.is_file():
                found.append((stat.st_mtime_ns, str(path), stat.st_size, stat.st_mtime))
        found.sort()
        return {
            f"{path}:{mtime_ns}:{size}": {"path": path, "size": size, "mtime": mtime}
            for mtime_ns, path, size, mtime in found
        }

    def _load_ledger(self) -> set[str]:
        """The keys of acked files; the ledger is rewritten without files that are gone."""
        try:
            lines = self._ledger.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return set()
        keys = set()
        for line in lines:
            try:
                keys.add(json.loads(line))
            except ValueError:  # a line cut short by a crash: that file is yielded again
                log.warning("file_ledger_line_skipped", ledger=str(self._ledger), line=line)
        current = keys & self._scan().keys()
        if current != keys:
            temporary = self._ledger.with_name(LEDGER_NAME + ".tmp")
            temporary.write_text("".join(json.dumps(key) + "\n" for key in sorted(current)))
            temporary.replace(self._ledger)
        return current

    def _append_ledger(self, key: str) -> None:
        with self._ledger.open("a", encoding="utf-8") as ledger:
            ledger.write(json.dumps(key) + "\n")
