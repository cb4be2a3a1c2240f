"""``study.fidelity``: the search on a smaller model of the target's family (``proxy``): its schema
(:class:`FidelitySpec`, :class:`ProxySpec`, :class:`TransferRule`), its parsing, and the rules between it and the rest
of the experiment that need no trainer: its overrides set no tuned key and no secret, a transfer rule names a float
parameter, and the study ranks sampled settings by one value with a successive-halving or median pruner (what the
proxy's promotion and check assume).

What needs the trainer (which keys name the model, whether the proxy's model exists and shares the target's tokenizer,
the hidden sizes a ``scale_by: hidden_ratio`` rule reads) is the backends' check (:mod:`hpo.backends._fidelity`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpo.experiment._secrets import is_secret_key

TRANSFER_SCALES = ("hidden_ratio",)  # study.fidelity.proxy.transfer.<param>.scale_by: the factors a backend can read


@dataclass(frozen=True)
class TransferRule:
    """How a tuned value found on the proxy carries to the target (``study.fidelity.proxy.transfer.<param>``): the
    target runs ``factor`` times the value the proxy runs. The study's values are the target's, so a proxy run of a
    value ``v`` trains with ``v / factor``. ``multiply``: the factor itself; ``scale_by: hidden_ratio``: the proxy's
    hidden size over the target's (muP's rule for Adam learning rates: a model twice as wide takes half the rate),
    read from the two models' configs when the experiment is loaded."""

    multiply: float | None = None
    scale_by: str | None = None

    def text(self) -> str:
        return f"multiply {self.multiply:g}" if self.multiply is not None else f"scale_by {self.scale_by}"


@dataclass(frozen=True)
class ProxySpec:
    """``study.fidelity.proxy``: the search's trials run on a smaller model of the target's family (its
    ``overrides``: the model path and what must change with it), its ``promote`` best settings then run on the target
    for ``promote_steps`` steps, and the study checks that the two rank them alike before the confirmation races them
    on the target (``docs/driver.md``, "Model-size fidelity")."""

    overrides: dict[str, Any] = field(default_factory=dict)
    promote: int = 4
    promote_steps: int | None = None
    transfer: dict[str, TransferRule] = field(default_factory=dict)
    # when the proxy holds, the confirmation races at most this many promoted settings on the target (the proxy's
    # best first, only those the proxy cannot tell apart: final proxy values within the race's resolution of its best;
    # beyond it, the target's best at promote_steps when the target has the pick further behind it there than the
    # proxy had: hpo.samplers.unmeasured_setting)
    confirm_top: int = 1
    # the proxy's best settings it cannot tell apart (final values within the race's resolution of its best, among
    # the ``promote`` it ranks first) each run this many more times on the proxy, on the race's seeds, before the
    # promotion; the proxy then ranks them by their mean over its seeds (a proxy run is a fraction of a target run:
    # its seeds separate a tie cheaper than the target race does). 0: never.
    tie_seeds: int = 1


@dataclass(frozen=True)
class FidelitySpec:
    proxy: ProxySpec | None = None


class Param(Protocol):  # hpo.experiment._schema.Param, as far as it is read here
    @property
    def name(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def type(self) -> str: ...


Error = Callable[[str, str], Exception]
WHERE = "study.fidelity.proxy"
PROXY_FIELDS = ("overrides", "promote", "promote_steps", "transfer", "confirm_top", "tie_seeds")


def parse_fidelity(raw: Any, params: Sequence[Param], error: Error) -> FidelitySpec:
    """``study.fidelity`` (None: no proxy)."""
    if raw is None:
        return FidelitySpec()
    if not isinstance(raw, dict):
        raise error("study.fidelity", f"expected a mapping like {{proxy: {{overrides: ...}}}}, got {raw!r}")
    for key in raw:
        if key != "proxy":
            raise error(f"study.fidelity.{key}", "unknown field; known: proxy")
    proxy = raw.get("proxy")
    if proxy is None:
        return FidelitySpec()
    if not isinstance(proxy, dict):
        raise error(WHERE, f"expected a mapping with overrides (the proxy model's keys), got {proxy!r}")
    for key in proxy:
        if key not in PROXY_FIELDS:
            raise error(f"{WHERE}.{key}", f"unknown field; known: {', '.join(PROXY_FIELDS)}")
    overrides = _overrides(proxy.get("overrides"), params, error)
    promote = _count(proxy, "promote", 4, 2, error)
    steps = _count(proxy, "promote_steps", None, 1, error)
    transfer = _transfer(proxy.get("transfer"), params, error)
    top = int(_count(proxy, "confirm_top", 1, 1, error) or 1)
    if top > int(promote or 4):
        raise error(f"{WHERE}.confirm_top", f"{top} is more than promote={promote} (the race's field is taken from "
                    "the promoted settings)")
    ties = int(_count(proxy, "tie_seeds", 1, 0, error) or 0)
    return FidelitySpec(ProxySpec(overrides, int(promote or 4), steps, transfer, top, ties))


def _overrides(raw: Any, params: Sequence[Param], error: Error) -> dict[str, Any]:
    """The proxy's trainer overrides: dotted keys to values, none of them a tuned key."""
    if not isinstance(raw, dict) or not raw:
        raise error(f"{WHERE}.overrides", f"expected a non-empty mapping of trainer keys (the proxy model's path and "
                    f"what must change with it), got {raw!r}")
    tuned = {p.key.lstrip("+"): p.name for p in params}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{WHERE}.overrides.{key}"
        if not isinstance(key, str) or not key or any(c.isspace() or c == "=" for c in key):
            raise error(f"{WHERE}.overrides", f"key {key!r} is not a dotted trainer key")
        if is_secret_key(key):  # its value would reach argv and the stored experiment: the fixed overrides' is safe
            raise error(where, "names a secret (a token, password or key): set it as a fixed override (overrides)")
        if isinstance(value, dict):
            raise error(where, f"expected a value, got a mapping {value!r}")
        if key.lstrip("+") in tuned:
            raise error(where, f"{key.lstrip('+')!r} is tuned by parameter {tuned[key.lstrip('+')]!r}: a proxy "
                        "changes the model and what must change with it, never a searched value")
        out[key] = value
    return out


def _count(raw: dict[str, Any], name: str, default: int | None, least: int, error: Error) -> int | None:
    value = raw.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise error(f"{WHERE}.{name}", f"expected an integer >= {least}, got {value!r}")
    return value


def _transfer(raw: Any, params: Sequence[Param], error: Error) -> dict[str, TransferRule]:
    """``transfer``: parameter name -> one rule (``multiply: F`` with F > 0, or ``scale_by: hidden_ratio``)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise error(f"{WHERE}.transfer", f"expected a mapping of parameter names to rules, got {raw!r}")
    by_name = {p.name: p for p in params}
    out: dict[str, TransferRule] = {}
    for name, rule in raw.items():
        where = f"{WHERE}.transfer.{name}"
        p = by_name.get(name)
        if p is None:
            raise error(where, f"not a parameter (known: {', '.join(sorted(by_name))})")
        if p.type != "float":
            raise error(where, f"parameter {name!r} is {p.type}: a transfer rule scales a float parameter")
        if not isinstance(rule, dict) or len(rule) != 1 or next(iter(rule)) not in ("multiply", "scale_by"):
            raise error(where, f"expected {{multiply: <factor>}} or {{scale_by: {' | '.join(TRANSFER_SCALES)}}}, "
                        f"got {rule!r}")
        if "multiply" in rule:
            f = rule["multiply"]
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
                raise error(f"{where}.multiply", f"expected a finite number > 0, got {f!r}")
            out[name] = TransferRule(multiply=float(f))
        else:
            if rule["scale_by"] not in TRANSFER_SCALES:
                raise error(f"{where}.scale_by", f"{rule['scale_by']!r} is not one of {', '.join(TRANSFER_SCALES)}")
            out[name] = TransferRule(scale_by=str(rule["scale_by"]))
    return out


def check_fidelity(spec: FidelitySpec, strategy: str, kind: str, multi: bool, pruner: str, n_trials: int,
                   error: Error) -> None:
    """What a proxy search assumes of the rest of the study: one value to rank by, sampled trials (not a PBT
    population, not a throughput study), a pruner whose rungs are steps of one trial (not Hyperband's brackets), and
    more search trials than settings to promote."""
    proxy = spec.proxy
    if proxy is None:
        return
    if strategy == "pbt" or kind == "throughput" or multi:
        what = "study.strategy pbt" if strategy == "pbt" else "a throughput study" if kind == "throughput" \
            else "objective mode pareto"
        raise error(WHERE, f"not supported with {what}: a proxy search ranks sampled settings by one learning value")
    if pruner == "hyperband":
        raise error(WHERE, "not supported with pruner type hyperband (its brackets are not one search's rungs); use "
                    "successive_halving or median")
    if proxy.promote > n_trials:
        raise error(f"{WHERE}.promote", f"{proxy.promote} is more than study.n_trials={n_trials} (the proxy "
                    "search's trials)")
