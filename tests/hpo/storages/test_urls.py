"""Storage URLs shown safely (:mod:`hpo.storages._urls`): each secret masked wherever a URL is printed (a password
in the userinfo, a credential-named query parameter), a database's bare user name (a role) shown, and every copy of a
secret, as written or percent-decoded, scrubbed from an error text."""

from __future__ import annotations

import pytest

from hpo.storages._urls import mask_url, scrub


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg2://alice:S3cretPW@db.example:5432/hpo", "postgresql+psycopg2://alice:***@db.example:5432/hpo"),
    ("redis://:S3cretPW@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("rediss://bob:S3cretPW@cache:6380/1", "rediss://bob:***@cache:6380/1"),
    ("sqlite:////tmp/x.db", "sqlite:////tmp/x.db"),
    ("postgresql://carol@h/db", "postgresql://carol@h/db"),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    if "S3cretPW" in url:
        assert "S3cretPW" not in scrub(f"failed: {url} (password S3cretPW)", url)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app@db/hpo?sslpassword=S3cretPW&sslmode=require",
     "postgresql://app@db/hpo?sslpassword=***&sslmode=require"),
    ("redis://127.0.0.1:6379/0?password=S3cretPW", "redis://127.0.0.1:6379/0?password=***"),
    ("postgresql://u:p%40ss%2FS3cretPW@db/hpo", "postgresql://u:***@db/hpo"),
])
def test_a_credential_in_the_query_or_percent_encoded_is_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_scrub_replaces_the_url_and_every_copy_of_its_secret() -> None:
    url = "postgresql+psycopg2://u:p%40ss@db:5432/hpo"
    text = f'connection to {url} failed: password authentication failed ("p@ss" / p%40ss)'
    assert scrub(text, url) == ('connection to postgresql+psycopg2://u:***@db:5432/hpo failed: password '
                                'authentication failed ("***" / ***)')
    assert scrub("no secret here", "sqlite:///x.db") == "no secret here"
