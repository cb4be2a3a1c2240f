"""``study.speed_from`` as the commands use it: a learning study's every trial runs with the settings a throughput
study recommends. :class:`SpeedFrom` looks them up while ``search`` or ``validate`` loads the experiment (their
``--override`` texts, applied before its checks: :func:`hpo.backends.load_space`); :func:`recheck_speed` asks the
source again when ``resume``, ``worker`` or ``confirm`` opens the stored study. What the settings are, and what is
reported of them, is :mod:`hpo.reporting._speed_from`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo.experiment import Space, SpaceError


@dataclasses.dataclass
class SpeedFrom:
    """``study.speed_from`` for :func:`hpo.backends.load_space`: called with the experiment, the named throughput
    study's recommended settings as ``--override`` texts, looked up in ``storage`` (else its SQLite file in
    ``studies_dir``); SpaceError (one line) unless it has a complete confirmation. What the search reports and keeps
    of them is left in ``info`` (and said with ``say``, when given)."""

    storage: str | None
    studies_dir: Path
    say: Callable[[str], None] | None = None
    info: dict[str, Any] | None = None

    def __call__(self, space: Space) -> list[str]:
        from hpo.reporting import speed_from, speed_from_note

        extra, self.info = speed_from(space, speed_url(space, self.storage, self.studies_dir))
        if self.say is not None:
            self.say(speed_from_note(self.info))
        return extra


def speed_url(space: Space, storage: str | None, studies_dir: Path) -> str:
    """The storage of the throughput study ``study.speed_from`` names (``--storage``, else its SQLite file in the
    studies directory), checked; SpaceError (one line naming the key) when its SQLite file is not there: nothing is
    created looking for it."""
    from hpo.storages import check_storage_url, check_study_name, default_storage_url, sqlite_path

    name = space.study.speed_from
    assert name is not None
    url = storage or default_storage_url(studies_dir, check_study_name(name, "study.speed_from"))
    check_storage_url(url)
    db = sqlite_path(url)
    if db is not None and not db.is_file():
        raise SpaceError(f"{space.source}: study.speed_from: {name!r}: no study {name!r}: {db} does not exist (a "
                         "throughput study searched and confirmed first)")
    return url


def recheck_speed(space: Space, study: Any, storage: str | None, studies_dir: Path) -> Space:
    """A stored learning study with ``study.speed_from``: its source asked again; settings it no longer recommends
    (its math now differs on new seeds, another pick won, the study is gone) are taken out for this run's trials,
    the user's own values back, with one line, and the reason is kept in the study (``speed_from.withdrawn``)."""
    from hpo.reporting import speed_recheck, withdrawn_note, without_speed

    info = study.user_attrs.get("speed_from")
    if space.study.speed_from is None or not isinstance(info, dict) or not isinstance(info.get("settings"), dict):
        return space
    try:
        why = speed_recheck(space, info, speed_url(space, storage, studies_dir))
    except SpaceError as err:  # its storage is not there any more
        why = str(err).removeprefix(f"{space.source}: study.speed_from: {space.study.speed_from!r}: ")
    if why is None:
        if "withdrawn" in info:  # withdrawn by an earlier run, recommended again
            print(f"{space.source}: study.speed_from: throughput study {space.study.speed_from} recommends "
                  + " ".join(f"{k}={v}" for k, v in info["settings"].items()) + " again; this run's trials run "
                  "with them", flush=True)
            study.set_user_attr("speed_from", {k: v for k, v in info.items() if k != "withdrawn"})
        return space
    space, shown = without_speed(space, info)
    print(withdrawn_note(space, info, why, shown), flush=True)
    study.set_user_attr("speed_from", {**info, "withdrawn": why})
    return space
