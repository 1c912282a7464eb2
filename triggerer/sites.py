"""Where a definition was written: the file and line of the user's code that made it, and the
modules whose top-level code was running then."""

from __future__ import annotations

import functools
import os
import sys
from types import FrameType

Site = tuple[str, int]
"""A file (as its code was compiled: absolute for a pipeline file) and a line in it."""

_OWN = tuple(
    os.path.join(os.path.realpath(os.path.join(os.path.dirname(__file__), "..", package)), "")
    for package in ("triggerer", "watchers")
)
"""triggerer's own code, and its providers': a definition is made by the code that called it.
Real paths, as :func:`_is_own` compares: triggerer imported through a symlinked folder has
frames that name the link."""


def caller_site() -> Site | None:
    """The innermost frame outside triggerer's and its providers' code: the line of a pipeline
    file (or of a module it imports) that is making the definition now."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_own(filename):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None


def module_sites() -> tuple[Site, ...]:
    """Each frame running a module's top-level code now, innermost first, as its file and
    line: the module whose import leads to this call, at its line running it, then the module
    that imports that one, at its ``import``, and so on."""
    sites = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            sites.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(sites)


@functools.lru_cache(maxsize=1024)
def _is_own(filename: str) -> bool:
    # "<frozen importlib._bootstrap>", "<string>": no file of triggerer's.
    return not filename.startswith("<") and os.path.realpath(filename).startswith(_OWN)
