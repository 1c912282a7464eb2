"""Where a definition was written: the file and line of the user's code that made it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType

Site = tuple[str, int]
"""A file (as its code was compiled: absolute for a pipeline file) and a line in it."""

_OWN = tuple(
    f"{Path(__file__).resolve().parent.parent / package}{os.sep}"
    for package in ("triggerer", "watchers")
)
"""triggerer's own code, and its providers': a definition is made by the code that called it."""


def caller_site() -> Site | None:
    """The innermost frame outside triggerer's and its providers' code: the line of a pipeline
    file (or of a module it imports) that is making the definition now."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_OWN):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None
