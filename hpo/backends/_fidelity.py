"""``study.fidelity.proxy`` against the trainer (:func:`check_proxy`, on every load of an experiment): the backend names
the keys of its model (``Backend.model_keys``; a trainer that names none cannot run a proxy search), the proxy sets
one of them, keeps off the held-out split, names a model that exists (a local directory, a built-in the trainer
knows; a hub id is not checked here, and says so), and has the target's tokenizer (token ids must mean the same on
both: ``Backend.model_facts``, :mod:`hpo.backends._models`); a target whose critic has a model of its own needs the
proxy to name one too. Each refusal is one line naming the key.

Then what a proxy run is (:func:`proxy_space`): the experiment with the proxy's overrides after the fixed ones and
each transfer rule's factor applied to the value the trainer gets (:func:`transfer_factors`: ``multiply``, or the
two models' hidden sizes for ``scale_by: hidden_ratio``)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hpo.backends._base import Backend, _set_value
from hpo.backends._models import ModelFacts
from hpo.experiment import Space, SpaceError, check_no_test_split, located_error

WHERE = "study.fidelity.proxy"
_SAID: set[str] = set()  # notes said once per process (an experiment is loaded more than once)


def _note(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(f"note: {line}", file=sys.stderr, flush=True)


def proxy_overrides(space: Space) -> dict[str, Any]:
    """The fixed overrides of a proxy run: the experiment's, then the proxy's (which win)."""
    proxy = space.study.fidelity.proxy
    assert proxy is not None
    over = {k.lstrip("+"): k for k in proxy.overrides}
    return {**{k: v for k, v in space.overrides.items() if k.lstrip("+") not in over}, **proxy.overrides}


def check_proxy(space: Space, origin: Mapping[str, str], backend: Backend) -> None:
    """SpaceError (one line naming the key) when the proxy cannot stand for the target (see the module docstring)."""
    proxy = space.study.fidelity.proxy
    if proxy is None:
        return

    def error(where: str, msg: str) -> SpaceError:
        return located_error(space, dict(origin), where, msg)

    if not backend.model_keys:
        raise error(WHERE, f"trial.backend {backend.name} names no model keys (Backend.model_keys), so a proxy run "
                    "cannot be told from a target run; a proxy search needs a trainer that says which keys name its "
                    "model (verl_core, verl, trl)")
    keys = set(backend.model_keys)
    if not any(k.lstrip("+") in keys for k in proxy.overrides):
        raise error(f"{WHERE}.overrides", f"sets none of the keys that name the model ({', '.join(backend.model_keys)})"
                    ": a proxy runs a smaller model of the target's family")
    confirmation = backend.confirmation
    check_no_test_split(proxy.overrides, {}, [], lambda where, msg: error(f"{WHERE}.{where}", msg),
                        confirmation.heldout_keys if confirmation else (),
                        confirmation.heldout_prefixes if confirmation else {})
    for key in backend.model_keys[1:]:  # a critic with a model of its own: the proxy's must be named too
        target = _set_value(space.overrides, (key,))
        if target is not None and _set_value(proxy.overrides, (key,)) is None:
            raise error(f"{WHERE}.overrides", f"the target sets {key}={target}; a proxy must set it too (its own "
                        "model of the family, or null: the policy's)")
    for key, value in proxy.overrides.items():
        if key.lstrip("+") in keys | set(backend.tokenizer_keys) and isinstance(value, str) and value.strip() \
                and value.strip() != "null":
            facts = backend.model_facts(value.strip())
            if facts.missing:
                raise error(f"{WHERE}.overrides.{key}", f"{facts.missing}: the proxy's model must exist")
            if facts.note:
                _note(f"{space.source}: {WHERE}.overrides.{key}: {facts.note}")
    _check_tokenizer(space, backend, error)
    transfer_factors(space, backend, error)


def _check_tokenizer(space: Space, backend: Backend, error: Callable[[str, str], SpaceError]) -> None:
    """The proxy's tokenizer is the target's (both known here: equal identities of one kind)."""
    target_path = backend.tokenizer_path(space, space.overrides)
    proxy_path = backend.tokenizer_path(space, proxy_overrides(space))
    if target_path is None or proxy_path is None:
        _note(f"{space.source}: {WHERE}: the target's or the proxy's model is not named in the overrides here; their "
              "tokenizers are not compared")
        return
    if target_path == proxy_path:
        return
    target, proxy = backend.model_facts(target_path), backend.model_facts(proxy_path)
    if target.tokenizer is None or proxy.tokenizer is None or target.tokenizer[0] != proxy.tokenizer[0]:
        _note(f"{space.source}: {WHERE}: the tokenizers of {proxy_path!r} and {target_path!r} cannot be compared here"
              f"{_why(target, proxy)}; a proxy must share the target's tokenizer")
        return
    if target.tokenizer != proxy.tokenizer:
        key = next((k for k in space.study.fidelity.proxy.overrides  # type: ignore[union-attr]
                    if k.lstrip("+") in (*backend.tokenizer_keys, *backend.model_keys[:1])), "overrides")
        raise error(f"{WHERE}.overrides.{key}", f"the proxy's tokenizer ({proxy_path}) is not the target's "
                    f"({target_path}): token ids would not mean the same on both; a proxy is a smaller model of the "
                    "target's family, with its tokenizer")


def _why(target: ModelFacts, proxy: ModelFacts) -> str:
    notes = [n for n in (target.note, proxy.note) if n]
    return f" ({'; '.join(notes)})" if notes else ""


def transfer_factors(space: Space, backend: Backend,
                     error: Callable[[str, str], SpaceError] | None = None) -> dict[str, float]:
    """Each transfer rule's factor (the target runs factor x the proxy's value): ``multiply``, or for ``scale_by:
    hidden_ratio`` the proxy's hidden size over the target's; SpaceError naming the rule when a size is unknown."""
    proxy = space.study.fidelity.proxy
    if proxy is None:
        return {}
    error = error or (lambda where, msg: SpaceError(f"{space.source}: {where}: {msg}"))
    out: dict[str, float] = {}
    for name, rule in proxy.transfer.items():
        if rule.multiply is not None:
            out[name] = rule.multiply
            continue
        paths = backend.model_path(space, proxy_overrides(space)), backend.model_path(space, space.overrides)
        sizes = [backend.model_facts(p).hidden if p else None for p in paths]
        if sizes[0] is None or sizes[1] is None:
            raise error(f"{WHERE}.transfer.{name}.scale_by", f"hidden_ratio needs both models' hidden sizes; "
                        f"{paths[0] if sizes[0] is None else paths[1]!r} gives none here (no config.json with "
                        "hidden_size): write multiply: <factor> instead")
        out[name] = sizes[0] / sizes[1]
    return out


def proxy_space(space: Space, factors: Mapping[str, float]) -> Space:
    """The experiment a proxy run runs: the proxy's overrides after the fixed ones, and each tuned value the trainer
    gets divided by its transfer factor (the study's values are the target's)."""
    return dataclasses.replace(space, overrides=proxy_overrides(space),
                               scale={name: 1.0 / f for name, f in factors.items()})
