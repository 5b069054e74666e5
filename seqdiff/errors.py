"""The one base class of user errors.

`seqdiff` prints a `SeqdiffError` as one line (`seqdiff CMD: error: ...`) and exits with status 2: a bad
file, key, value, checkpoint or request, named with what is allowed. Every other exception is a bug or an
environment failure and keeps its traceback. It derives from ValueError so that code written against the
earlier per-module classes (all ValueErrors) keeps working.

A leaf module: it imports nothing from seqdiff, so every layer can raise it.
"""

from __future__ import annotations


class SeqdiffError(ValueError):
    """A user error: one line naming the file, key or value and what is allowed."""


__all__ = ["SeqdiffError"]
