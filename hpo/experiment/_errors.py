"""How a bad experiment is reported: :class:`SpaceError`, whose message is one line naming the file (or the
``--override`` it came from), the field and the value, and :class:`ErrorContext`, which builds that line for a field.

An ``--override`` text is repeated in an error as :func:`shown_override` gives it (a long one cut, with its size)."""

from __future__ import annotations

from hpo.experiment._secrets import is_secret_key

MAX_SHOWN_OVERRIDE = 60  # characters of an --override text an error line repeats


class SpaceError(ValueError):
    """A bad experiment file or override; ``str(err)`` is one line for the user."""


def shown_override(text: str) -> str:
    """An ``--override`` text as an error line shows it: a long one cut, with its size; a secret's value never
    (:func:`hpo.experiment._secrets.is_secret_key`)."""
    key, sep, _ = text.partition("=")
    if sep and is_secret_key(key.strip()):
        return f"{key}=<a secret, not shown>"
    if len(text) <= MAX_SHOWN_OVERRIDE:
        return text
    return f"{text[:MAX_SHOWN_OVERRIDE]}... ({len(text.encode('utf-8', 'surrogateescape'))} bytes)"


class ErrorContext:
    """Names the origin of a field in error messages (the file, or the --override that set it)."""

    def __init__(self, source: str, overridden: dict[str, str]) -> None:
        self.source = source
        self.overridden = overridden

    def error(self, where: str, msg: str) -> SpaceError:
        for path, text in self.overridden.items():
            if where == path or where.startswith(path + ".") or path.startswith(where + "."):
                return SpaceError(f"--override '{shown_override(text)}': {where}: {msg}")
        return SpaceError(f"{self.source}: {where}: {msg}" if where else f"{self.source}: {msg}")
