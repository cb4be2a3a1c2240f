"""The first training step's rollout of a verl 0.9.1 run, recorded by one run and replayed into another, so that two
runs of one seed (the user's config and a throughput pick) update on the same samples in the same order and their
first-step losses and gradient norm agree to float noise (the strict same-math check, ``hpo.reporting._speed``).

Loaded inside every process of a verl trial by verl's own external-module hook (``VERL_USE_EXTERNAL_MODULES``; the
driver puts this directory on ``PYTHONPATH``, ``hpo.backends.verl._launch``) when the trial's environment names a
record or a replay directory. Nothing here runs otherwise. It imports nothing of verl when loaded (verl imports it
from ``verl/__init__``); each patch is applied when verl's own module is first imported:

* ``LLMServerClient.generate``: a request of the first training step
  (``global_steps == 1``, not validation) is keyed by its prompt's token ids and its session (``rollout.n`` index).
  Record (``$VERL_HPO_FIRST_ROLLOUT_RECORD``): the engine's answer is appended to ``<dir>/<pid>.jsonl``. Replay
  (``$VERL_HPO_FIRST_ROLLOUT_REPLAY``): the recorded answer is returned without asking the engine; a request with
  no recording (another prompt, a record cut short) asks the engine and counts as missed.
* ``AgentLoopWorker._run_agent_loop``: sets the step and session the request belongs to.
* the trainer's ``uuid.uuid4`` (``trainer/ppo/v1/trainer_base.py``): prompt uids from a counter instead of random,
  and ``ReplayBuffer._materialize_batch`` sorts a batch's samples by uid, session and output: verl orders a batch by
  when each sample finished, which changes the update's mini-batches run to run.

Every process writes what it did to ``$VERL_HPO_FIRST_ROLLOUT_REPORT/<pid>.json`` (``recorded``, ``replayed``,
``missed``); the driver sums them (``hpo.study._confirm._first_rollout``). Step 1 only: later steps sample as usual,
so a throughput run's measured steps (after ``study.throughput.warmup_steps``) are real generation."""

from __future__ import annotations

import contextvars
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import uuid as _uuid
from typing import Any

RECORD_ENV = "VERL_HPO_FIRST_ROLLOUT_RECORD"
REPLAY_ENV = "VERL_HPO_FIRST_ROLLOUT_REPLAY"
REPORT_ENV = "VERL_HPO_FIRST_ROLLOUT_REPORT"
STEP = 1  # verl 0.9.1's first training step (trainer_base.fit: "we start from step 1")
MAX_LINE = 16 << 20  # a recorded line longer than this is not read (a broken or planted record)

_RECORD, _REPLAY, _REPORT = os.environ.get(RECORD_ENV), os.environ.get(REPLAY_ENV), os.environ.get(REPORT_ENV)
_WHERE: contextvars.ContextVar[tuple[int, bool, int] | None] = contextvars.ContextVar("verl_hpo_where", default=None)
_LOCK = threading.Lock()
_COUNTS = {"recorded": 0, "replayed": 0, "missed": 0}
_RECORDS: dict[tuple[str, int], list[dict]] | None = None


def _int(x: object) -> int | None:
    """An int from verl's step / index values (ints, 0-d tensors, NonTensorData)."""
    for v in (x, getattr(x, "data", None)):
        try:
            return int(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    return None


def _key(prompt_ids: list[int], session: int) -> tuple[str, int]:
    return hashlib.sha1(json.dumps([int(t) for t in prompt_ids]).encode()).hexdigest(), int(session)


def _report() -> None:
    if not _REPORT:
        return
    os.makedirs(_REPORT, exist_ok=True)
    path = os.path.join(_REPORT, f"{os.getpid()}.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(_COUNTS, f)
    os.replace(tmp, path)


def _load() -> dict[tuple[str, int], list[dict]]:
    """The recorded answers by (prompt hash, session), in the order they were recorded."""
    global _RECORDS
    if _RECORDS is None:
        out: dict[tuple[str, int], list[dict]] = {}
        root = _REPLAY or ""
        names = sorted(os.listdir(root)) if root and os.path.isdir(root) else []
        for name in names:
            path = os.path.join(root, name)
            if not name.endswith(".jsonl") or not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, "rb") as f:
                while line := f.readline(MAX_LINE):
                    try:
                        rec = json.loads(line)
                        out.setdefault((str(rec["prompt"]), int(rec["session"])), []).append(rec)
                    except (ValueError, KeyError, TypeError):
                        continue
        _RECORDS = out
    return _RECORDS


# verl's originals of what is patched. Every replacement below is a module-level function (Ray pickles verl's actor
# classes; a function it can import by name is pickled by reference, a closure would be pickled by value)
_ORIGINAL: dict[str, Any] = {}


async def _generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):  # type: ignore[no-untyped-def]
    """``LLMServerClient.generate`` with the record or the replay of the first training step's requests."""
    original = _ORIGINAL["generate"]
    where = _WHERE.get()
    if where is None or where[0] != STEP or where[1]:
        return await original(self, request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
    key = _key(prompt_ids, where[2])
    if _REPLAY:
        with _LOCK:
            found = _load().get(key)
            rec = found.pop(0) if found else None
        if rec is not None:
            from verl.workers.rollout.replica import TokenOutput

            with _LOCK:
                _COUNTS["replayed"] += 1
                _report()
            extra = rec.get("extra_fields")
            return TokenOutput(token_ids=[int(t) for t in rec["token_ids"]], log_probs=rec.get("log_probs"),
                               stop_reason=rec.get("stop_reason"), num_preempted=rec.get("num_preempted"),
                               extra_fields=extra if isinstance(extra, dict) else {})
        with _LOCK:
            _COUNTS["missed"] += 1
            _report()
    out = await original(self, request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
    if _RECORD and not _REPLAY:
        line = json.dumps({"prompt": key[0], "session": key[1], "token_ids": list(out.token_ids),
                           "log_probs": None if out.log_probs is None else list(out.log_probs),
                           "stop_reason": out.stop_reason, "num_preempted": out.num_preempted,
                           "extra_fields": _plain(out.extra_fields)})
        with _LOCK:
            os.makedirs(_RECORD, exist_ok=True)
            with open(os.path.join(_RECORD, f"{os.getpid()}.jsonl"), "a") as f:
                f.write(line + "\n")
            _COUNTS["recorded"] += 1
            _report()
    return out


def _plain(fields: dict) -> dict:
    """The JSON-able entries of a ``TokenOutput.extra_fields`` (the engine's weight versions ``min_global_steps`` /
    ``max_global_steps`` the trainer's metrics read); anything else is left out."""
    out = {}
    for k, v in (fields or {}).items():
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[str(k)] = v
    return out


def _patch_llm_server(module) -> None:  # type: ignore[no-untyped-def]
    """verl 0.9.1's ``LLMServerClient`` (the agent loop's client of the rollout servers). Its subclass for the fully
    asynchronous trainer keeps its own ``generate``: there nothing is recorded or replayed, the report stays empty
    and the driver checks that run the loose way."""
    if "generate" not in _ORIGINAL:
        _ORIGINAL["generate"] = module.LLMServerClient.generate
        module.LLMServerClient.generate = _generate


async def _run_agent_loop(self, sampling_params, trajectory, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``AgentLoopWorker._run_agent_loop`` that first says which step and session its requests belong to."""
    session = kwargs.get("session_id", trajectory.get("rollout_n", 0))
    token = _WHERE.set((_int(trajectory.get("step")), bool(trajectory.get("validate")), _int(session) or 0))
    try:
        return await _ORIGINAL["run_agent_loop"](self, sampling_params, trajectory, *args, **kwargs)
    finally:
        _WHERE.reset(token)


def _patch_agent_loop(module) -> None:  # type: ignore[no-untyped-def]
    if "run_agent_loop" not in _ORIGINAL:
        _ORIGINAL["run_agent_loop"] = module.AgentLoopWorker._run_agent_loop
        module.AgentLoopWorker._run_agent_loop = _run_agent_loop


class _Uids:
    """``uuid`` for verl's trainer module: ``uuid4()`` counts (the same uids in every run of one config), the rest is
    the real module."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def uuid4(self) -> _uuid.UUID:
        with self._lock:
            self._n += 1
            return _uuid.UUID(int=self._n, version=4)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(_uuid, name)


def _patch_trainer(module) -> None:  # type: ignore[no-untyped-def]
    module.uuid = _Uids()


def _order(key: str) -> tuple:
    parts = key.split("_")
    try:
        return (parts[0], *(int(p) for p in parts[1:]))
    except ValueError:
        return (key,)


def _materialize_batch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``ReplayBuffer._materialize_batch`` with the batch's samples in uid, session and output order."""
    meta = _ORIGINAL["materialize_batch"](self, *args, **kwargs)
    order = sorted(range(len(meta.keys)), key=lambda i: _order(meta.keys[i]))
    meta.keys[:] = [meta.keys[i] for i in order]
    meta.tags[:] = [meta.tags[i] for i in order]
    return meta


def _patch_replay_buffer(module) -> None:  # type: ignore[no-untyped-def]
    if "materialize_batch" not in _ORIGINAL:
        _ORIGINAL["materialize_batch"] = module.ReplayBuffer._materialize_batch
        module.ReplayBuffer._materialize_batch = _materialize_batch


_PATCHES = {
    "verl.workers.rollout.llm_server": _patch_llm_server,
    "verl.experimental.agent_loop.agent_loop": _patch_agent_loop,
    "verl.trainer.ppo.v1.trainer_base": _patch_trainer,
    "verl.trainer.ppo.v1.replay_buffer": _patch_replay_buffer,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch) -> None:  # type: ignore[no-untyped-def]
        self._inner, self._patch = inner, patch

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self._inner.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Applies a patch right after verl's own module named in :data:`_PATCHES` is executed."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, _PATCHES[name])
        return spec


def _install() -> None:
    if not (_RECORD or _REPLAY):
        return
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


_install()
