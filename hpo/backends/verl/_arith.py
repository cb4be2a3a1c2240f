"""The arithmetic task for real verl on the CPU (``search_spaces/verl_grpo_cpu.yaml``), written locally: no download.

    python -m hpo.backends.verl._arith [--config NAME] [key=value ...]     # the experiment's prepare step

Writes, into :data:`ARITH_DIR` (``~/.cache/verl_hpo/verl_arith``) and only what is missing there:

* ``model/``: ``verl_core``'s built-in tiny Qwen2 (``verl_core.tiny_model``: a locally trained tokenizer, 2 layers,
  a warm start that answers ``a+b+1`` greedily on almost every problem while sampling finds the sum 15-20% of the
  time), built by ``verl_core`` in a subprocess of this interpreter (the driver's, which has torch) and copied;
  ``model_s/`` and ``model_l/`` (when named): the small and the large member of its family (:data:`MODELS`), for a
  proxy search;
* ``train.parquet``, ``val.parquet``, ``test.parquet``: ``verl_core``'s ``arith`` split (450/225/225 problems
  ``a+b=``) in verl's row format, written by ``verl_core`` in a subprocess, data source ``synthetic/arith``
  (:data:`TEST_SOURCE` for the test rows, so a confirmation run that validates on both files logs the test metric
  apart; one written by an older version with the validation's source is rewritten);
* ``reward.py``: :data:`REWARD_SOURCE`, verl's custom-reward contract (``compute_score``), 1.0 when the response's
  leading integer is the sum. verl records it as ``acc``: validation logs ``val-core/synthetic/arith/acc/mean@1``.

Paths named by the experiment outside :data:`ARITH_DIR` are the user's: a missing one is an error (exit 2).
This module imports neither torch nor verl nor ``verl_core`` (verl_core writes the model and the splits in
subprocesses: :data:`_BUILD_MODEL`, :data:`_WRITE_SPLIT`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hpo.backends.verl._data import ARITH_DIR, ARITH_FILES, prepare_args, resolve_path, run_prepare, split_list

SPLITS = dict(zip(ARITH_FILES, ("train", "val", "test"), strict=True))
MODEL, REWARD = "model", "reward.py"
# The tiny_arith family (verl_core.tiny_model: one tokenizer, one warm start): ``model`` the default size, ``model_s``
# and ``model_l`` the small and the large member, for a proxy search (search_spaces/verl_grpo_cpu_proxy.yaml).
MODELS = {MODEL: "tiny_arith", "model_s": "tiny_arith_s", "model_l": "tiny_arith_l"}
TEST_SOURCE = "synthetic/arith_test"  # verl logs the test rows as val-core/synthetic/arith_test/acc/mean@1
KEYS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path", "reward.custom_reward_function.path")
REWARD_SOURCE = '''"""Reward of the arith task (verl's custom-reward contract): 1.0 when the response starts with the
sum."""
import re

_INT = re.compile(r"-?\\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    m = _INT.match(solution_str.strip())
    return 1.0 if m is not None and m.group(0) == str(ground_truth).strip() else 0.0
'''
_BUILD_MODEL = ("import sys; from verl_core.tiny_model import ensure_tiny_arith; "
                "print(ensure_tiny_arith(log=False, name=sys.argv[1]))")
# verl_core's arith split argv[1] (train, val or test) in verl's row format, written to argv[2]; argv[3], when not
# empty, replaces the rows' data source
_WRITE_SPLIT = ("import sys; from pathlib import Path; from verl_core.tasks import BUILTIN, write_parquet; "
                "_, splits, rows = BUILTIN['arith']; split, dest, source = sys.argv[1:4]; "
                "out = rows(dict(zip(('train', 'val', 'test'), splits()))[split], split); "
                "write_parquet([{**r, 'data_source': source} for r in out] if source else out, Path(dest))")


def arith_dir() -> Path:
    return Path(os.path.expanduser(ARITH_DIR))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def _in_verl_core(what: str, code: str, *args: str) -> str:
    """The output of ``code`` run with ``args`` by a subprocess of this interpreter, where ``verl_core`` is imported;
    OSError naming ``what`` and the last line of its stderr when it fails."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise OSError(f"{what} failed: {tail}")
    return done.stdout


def _write_model(dest: Path) -> None:
    built = _in_verl_core("building the tiny model", _BUILD_MODEL, MODELS[dest.name])
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(built.strip().splitlines()[-1], tmp)
    tmp.replace(dest)


def _write_split(dest: Path) -> None:
    split = SPLITS[dest.name]
    _in_verl_core(f"writing the arith task's {split} split", _WRITE_SPLIT, split, str(dest),
                  TEST_SOURCE if split == "test" else "")


def _stale(path: Path) -> bool:
    """A test split written before its rows had a data source of their own."""
    if path.name != "test.parquet" or not path.is_file():
        return False
    import pyarrow.parquet as pq

    sources = pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist()
    return sources[:1] != [TEST_SOURCE]


def ensure(paths: Sequence[Path]) -> list[Path]:
    """Write each of ``paths`` that is missing and belongs to the task's directory; returns those written.
    ValueError (one line) for a missing path outside it."""
    home, written = arith_dir(), []
    for path in paths:
        if path.exists() and not (path.parent == home and _stale(path)):
            continue
        if path.parent != home or path.name not in (*SPLITS, *MODELS, REWARD):
            raise ValueError(f"{path} does not exist (only the arith task's files in {home} are generated)")
        home.mkdir(parents=True, exist_ok=True)
        if path.name in MODELS:
            _write_model(path)
        elif path.name == REWARD:
            _atomic_write(path, REWARD_SOURCE)
        else:
            _write_split(path)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    named = prepare_args(list(sys.argv[1:] if argv is None else argv), KEYS)
    return run_prepare(lambda: ensure([resolve_path(v) for value in named.values() for v in split_list(value)]))


if __name__ == "__main__":
    sys.exit(main())
