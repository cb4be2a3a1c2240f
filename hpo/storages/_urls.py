"""Storage URLs shown safely: the password masked wherever a URL is printed or rendered, and scrubbed from error
texts. Below both :mod:`hpo.storages._storage` (which opens storages) and :mod:`hpo.storages._retrying` (which words
their outages), so neither imports the other for it."""

from __future__ import annotations

import re

from hpo.experiment._tracking import MASK, redact_uri, uri_password

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (SQLAlchemy URLs and ``redis://user:pw@host``); shown
    wherever a storage URL is printed or rendered. Unparsable URLs are masked between ``:`` and ``@``."""
    if url.startswith(REDIS_SCHEMES):
        return redact_uri(url)
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.password is None:
            return url
        return str(parsed.render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - a malformed URL is still masked by pattern
        return re.sub(r"(//[^:/@]*:)[^@]*@", rf"\1{MASK}@", url)


def url_password(url: str) -> str | None:
    """The password in a storage URL, to scrub from error texts (None when there is none)."""
    try:
        if url.startswith(REDIS_SCHEMES):
            return uri_password(url)
        from sqlalchemy.engine import make_url

        pw = make_url(url).password
        return None if pw is None else str(pw)
    except Exception:  # noqa: BLE001
        m = re.search(r"//[^:/@]*:([^@]*)@", url)
        return m.group(1) if m else None


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with the URL masked and any copy of its password replaced."""
    text = text.replace(url, mask_url(url))
    pw = url_password(url)
    if pw:
        text = text.replace(pw, MASK)
    return text
