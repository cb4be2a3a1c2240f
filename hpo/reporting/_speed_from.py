"""``study.speed_from``: a learning study's every trial runs with the speed settings a throughput study recommends
(:mod:`hpo.reporting._speed`), only from a complete confirmation (:func:`~hpo.reporting._speed.speed_settings`), and
each later ``resume`` / ``worker`` / ``confirm`` asks the source again (:func:`speed_recheck`): settings it no longer
recommends are not applied (:func:`without_speed`: the user's own values come back), with one line."""

from __future__ import annotations

from typing import Any

from hpo.experiment import Space
from hpo.reporting._speed import SpeedPick, speed_settings


def _source(space: Space, storage_url: str, pending_ok: bool = False) -> tuple[Space, dict[str, Any], SpeedPick]:
    """The throughput study ``study.speed_from`` names: its space, its recommended settings and pick (SpaceError or
    ValueError, one line)."""
    from hpo.study import load_stored

    assert space.study.speed_from is not None
    speed_space, speed_study = load_stored(space.study.speed_from, storage_url, None)
    settings, pick = speed_settings(speed_study, speed_space, pending_ok)
    return speed_space, settings, pick


def speed_from(space: Space, storage_url: str) -> tuple[list[str], dict[str, Any]]:
    """``study.speed_from``: the trainer overrides (``overrides.key=value`` texts: never a field of the experiment)
    of the named throughput study's recommendation, for a learning study's every trial, and what to report of it;
    SpaceError (one line) when the study cannot give one or a setting clashes with a key this study tunes."""
    from hpo.experiment import SpaceError, format_value

    name = space.study.speed_from
    where = f"{space.source}: study.speed_from: {name!r}"
    try:
        speed_space, settings, pick = _source(space, storage_url)
    except (SpaceError, ValueError) as err:
        raise SpaceError(f"{where}: {err}") from None
    if speed_space.trial.backend != space.trial.backend:
        raise SpaceError(f"{where}: its trials ran trial.backend {speed_space.trial.backend}, this study's run "
                         f"{space.trial.backend}")
    tuned = {p.key.lstrip("+"): p.name for p in space.params}
    for key in settings:
        if key.lstrip("+") in tuned:
            raise SpaceError(f"{where}: it sets {key}, which this study tunes (params.{tuned[key.lstrip('+')]}); a "
                             "speed setting is fixed for every learning trial")
    replaced = {k: space.overrides[k] for k in settings if k in space.overrides and space.overrides[k] != settings[k]}
    info = {"study": name, "trial": pick.trial.number, "ratio": pick.ratio, "low": pick.low, "high": pick.high,
            "settings": {k: format_value(v) for k, v in settings.items()},
            "replaced": {k: format_value(v) for k, v in replaced.items()},
            "own": {k: format_value(space.overrides[k]) for k in settings if k in space.overrides}}
    return [f"overrides.{k}={format_value(v)}" for k, v in settings.items()], info


def speed_recheck(space: Space, info: dict[str, Any], storage_url: str) -> str | None:
    """Why the throughput study ``study.speed_from`` names no longer recommends the settings this learning study
    runs with (``info``: what its search recorded), or None while it does (runs still to run do not withdraw)."""
    from hpo.experiment import SpaceError, format_value

    try:
        _, settings, pick = _source(space, storage_url, pending_ok=True)
    except (SpaceError, ValueError) as err:
        return str(err)
    now = {k: format_value(v) for k, v in settings.items()}
    if now != info.get("settings"):
        return f"it now recommends trial {pick.trial.number}: " + " ".join(f"{k}={v}" for k, v in now.items())
    return None


def without_speed(space: Space, info: dict[str, Any]) -> tuple[Space, dict[str, str]]:
    """``space`` with the settings ``info`` recorded taken out: each key back to the user's own value (``own``,
    else ``replaced``: the stored texts, read as ``--override`` reads them), or unset; and those values as texts."""
    import dataclasses

    import yaml

    from hpo.experiment import load_yaml_text

    own = info.get("own") if isinstance(info.get("own"), dict) else info.get("replaced")
    own = own if isinstance(own, dict) else {}
    overrides, shown = dict(space.overrides), {}
    for key in info.get("settings") or {}:
        overrides.pop(key, None)
        if isinstance(own.get(key), str):
            try:
                overrides[key] = load_yaml_text(own[key]) if own[key].strip() else ""
            except yaml.YAMLError:
                overrides[key] = own[key]
            shown[key] = own[key]
    return dataclasses.replace(space, overrides=overrides), shown


def speed_from_note(info: dict[str, Any]) -> str:
    """One line for the search's start: which settings, from where, and what they save per trial."""
    ratio, low, high = info["ratio"], info.get("low"), info.get("high")
    interval = "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"
    settings = " ".join(f"{k}={v}" for k, v in info["settings"].items())
    replaced = "; replacing " + ", ".join(f"{k}={v}" for k, v in info["replaced"].items()) if info["replaced"] else ""
    return (f"speed settings from throughput study {info['study']} (trial {info['trial']}, same math as your config, "
            f"{ratio:.3f}x{interval} its throughput): {settings}{replaced}; each learning trial's training steps take "
            f"~{100 * (1 - 1 / ratio):.0f}% less time")


def withdrawn_note(space: Space, info: dict[str, Any], why: str, shown: dict[str, str]) -> str:
    """One line for a resume whose ``study.speed_from`` source no longer recommends the settings it ran with."""
    settings = " ".join(f"{k}={v}" for k, v in (info.get("settings") or {}).items())
    yours = ", ".join(f"{k}={shown[k]}" if k in shown else f"{k} unset" for k in info.get("settings") or {})
    return (f"warning: {space.source}: study.speed_from: throughput study {space.study.speed_from} no longer "
            f"recommends {settings} (trial {info.get('trial')}): {why}; this run's trials run without them, with "
            f"your config's own values: {yours}")
