"""A trial's start-up and exit: what it does not import, what its quick exit keeps, and the toxicity classifier that
needs no scikit-learn."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, read_metrics, run_trainer

UNUSED = ("sklearn", "scipy", "pandas")
PROBE = """
import atexit, json, runpy, sys, threading, time
out = sys.argv.pop(1)
UNUSED = UNUSED_LIST
def late_writer():  # a non-daemon thread still running when main returns: the exit waits for it
    time.sleep(0.2)
    open(out + ".thread", "w").write("done")
def probe():
    json.dump(sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in UNUSED}), open(out, "w"))
atexit.register(probe)
threading.Thread(target=late_writer).start()
runpy.run_module("verl_core", run_name="__main__")
""".replace("UNUSED_LIST", repr(UNUSED))


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_trial_imports_no_unused_optional_package_and_exits_like_python(tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """One step with an evaluation (toxicity on, the default): no scikit-learn, SciPy or pandas in the process at
    exit; the quick exit still waits for a non-daemon thread, runs the atexit handlers and flushes stdout."""
    out = _python(PROBE, str(tmp_path / "mods.json"), "train", "--metrics-file", "m.jsonl",
                  "trainer.total_training_steps=1", "trainer.test_freq=1", "trainer.val_before_train=false",
                  "trainer.cpu_threads=1", "evaluation.latency.enable=false", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "mods.json").read_text()) == []
    assert (tmp_path / "mods.json.thread").read_text() == "done"
    assert "step:1 - " in out.stdout.splitlines()[-1]
    assert "eval/toxicity_mean" in read_metrics(tmp_path / "m.jsonl")[-1]["data"]


def test_the_quick_exit_keeps_the_exit_code(tmp_path: Path) -> None:
    out = _python(PROBE, str(tmp_path / "mods.json"), "train", "trainer.no_such_key=1", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: "), out.stderr
    assert (tmp_path / "mods.json").is_file()


def test_the_optional_packages_import_as_usual_afterwards(tmp_path: Path) -> None:
    code = ("import sys; from verl_core.trainer import import_transformers; import_transformers()\n"
            "assert not {'sklearn', 'scipy'} & set(sys.modules), sorted(sys.modules)\n"
            "import sklearn.metrics, scipy.optimize; print('ok')")
    out = _python(code, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_transformers_that_already_knows_scipy_installed_imports_as_usual(tmp_path: Path) -> None:
    """transformers caches its answer: asked before the marks, it imports scipy.optimize; the import is retried
    unmarked instead of failing."""
    code = ("from transformers.utils import is_scipy_available; assert is_scipy_available()\n"
            "from verl_core.trainer import import_transformers; import_transformers()\n"
            "import transformers.loss.loss_for_object_detection as m; assert m.linear_sum_assignment; print('ok')")
    out = _python(code, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _corpus() -> list[str]:
    import profanity_check.profanity_check as pc

    words = sorted(pc.vectorizer.vocabulary_)
    rng = random.Random(0)
    texts = ["", "42", "the answer is 12", "you are a fucking idiot", "SHUT up YOU stupid bitch!!", "the the the",
             "Ünïcödé shit, shit; shit", "a", "  \n\t", "#### 17"]
    texts += [" ".join(rng.choice(words + ["the", "and", "42", "xyzzy", "Fuck", "ÉCOLE"])
                       for _ in range(rng.randint(1, 12))) for _ in range(1500)]
    return texts + [str(i) for i in range(200)]


def test_linear_profanity_equals_predict_prob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from profanity_check import predict_prob

    from verl_core.profanity import LinearProfanity, load_predictor

    monkeypatch.setenv("VERL_HPO_CACHE", str(tmp_path))
    ours = load_predictor()
    assert isinstance(ours, LinearProfanity)
    texts = _corpus()
    assert ours(texts) == [float(x) for x in predict_prob(texts)]  # bit for bit
    assert isinstance(load_predictor(), LinearProfanity)  # from the cache


def test_a_pipeline_of_another_shape_is_scored_by_scikit_learn(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from profanity_check import predict_prob

    from verl_core import profanity

    def other_shape(out: Path) -> None:
        raise profanity.Unsupported("vectorizer CountVectorizer")

    monkeypatch.setenv("VERL_HPO_CACHE", str(tmp_path))
    monkeypatch.setattr(profanity, "extract", other_shape)
    assert profanity.load_predictor() is predict_prob
    assert "CountVectorizer" in (profanity.cache_dir() / "UNSUPPORTED").read_text()
    assert profanity.load_predictor() is predict_prob  # remembered


def test_prepare_extracts_the_toxicity_arrays(tiny_model_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from verl_core.profanity import cache_dir

    monkeypatch.setenv("VERL_HPO_CACHE", str(tmp_path / "cache"))
    out = run_trainer(["prepare", f"actor_rollout_ref.model.path={tiny_model_dir}"], tmp_path,
                      env={"VERL_HPO_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 0 and out.stdout.strip().endswith("ready"), out.stderr[-2000:]
    assert (cache_dir() / "linear.npz").is_file()
