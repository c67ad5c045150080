"""File paths as users give them: a ``str`` or ``os.PathLike`` naming a file, checked in one place."""

from __future__ import annotations

import os

from .errors import InvalidArgumentError, shown

__all__ = ["file_path"]


def file_path(value: object, *, name: str = "path", expected: str = "a file path (str or os.PathLike)") -> str:
    """``value`` as a file system path, or InvalidArgumentError naming ``name``, the value and ``expected``."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise InvalidArgumentError(f"{name} must be a file path, got {shown(value)}", value=value, expected=expected)
    return os.fsdecode(value)
