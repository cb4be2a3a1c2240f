"""Storage URLs shown safely: every secret masked wherever a URL is printed or rendered (a password in the userinfo,
credential-named query parameters such as PostgreSQL's or Redis' ``?password=``), and scrubbed from error texts.
Below :mod:`hpo.storages._storage` (which opens storages), :mod:`hpo.storages._errors` and
:mod:`hpo.storages._retrying` (which word storage errors and outages), so none of them imports another for it."""

from __future__ import annotations

from hpo.experiment import MASK, mask_uri, uri_secrets

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def mask_url(url: str) -> str:
    """``url`` with each secret replaced by ``***`` (:func:`hpo.experiment._secrets.mask_uri`: the userinfo's
    password, a bare token as userinfo, credential-named query parameters); shown wherever a storage URL is printed
    or rendered. A database URL's bare user name (a role) is shown."""
    return mask_uri(url)


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with the URL masked and any copy of its secrets (as written and decoded)
    replaced."""
    text = text.replace(url, mask_url(url))
    for secret in sorted(uri_secrets(url), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
