"""The default toxicity classifier (``alt-profanity-check``) without importing scikit-learn in a trial.

``profanity_check.predict_prob`` unpickles a scikit-learn pipeline (a ``TfidfVectorizer`` and a
``CalibratedClassifierCV`` of five ``LinearSVC`` with sigmoid calibration), which imports scikit-learn, SciPy's
statistics and pandas: about a second of every trial's start-up on 2 CPU cores, for a model that is a vocabulary, an
IDF vector and five linear scores. The first use on a machine extracts those arrays into the cache
(``<cache>/toxicity/profanity_check_<version>_sklearn_<version>``; the one run that imports scikit-learn), and
:class:`LinearProfanity` scores with them in plain Python floats, in the order scikit-learn computes, so its
probabilities equal ``predict_prob``'s bit for bit (a test compares them). A pipeline of another shape (a future
version of the package) is not extracted: :func:`load_predictor` then returns ``predict_prob`` itself.
"""

from __future__ import annotations

import importlib.metadata
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from verl_core.tiny_model import build_once, cache_root

FORMAT = 1  # bump when the extracted arrays or their meaning change (part of the cache key)
PACKAGE = "alt-profanity-check"


class Unsupported(Exception):
    """The installed pipeline is not the shape :class:`LinearProfanity` reproduces."""


def _sklearn_predict_prob() -> Callable[[list[str]], Any]:
    from profanity_check import predict_prob

    return predict_prob  # type: ignore[no-any-return]


def extract(out_dir: Path) -> None:
    """Write the installed pipeline's arrays to ``out_dir/linear.npz`` (imports scikit-learn); :class:`Unsupported`
    when its shape is not the one :class:`LinearProfanity` computes."""
    import profanity_check.profanity_check as pc

    vec, model = pc.vectorizer, pc.model
    want = dict(analyzer="word", binary=False, input="content", lowercase=True, ngram_range=(1, 1), norm="l2",
                preprocessor=None, strip_accents=None, sublinear_tf=False, tokenizer=None, use_idf=True)
    params = vec.get_params()
    if type(vec).__name__ != "TfidfVectorizer" or any(params.get(k) != v for k, v in want.items()):
        raise Unsupported(f"vectorizer {type(vec).__name__} {params}")
    if (type(model).__name__ != "CalibratedClassifierCV" or getattr(model, "method", None) != "sigmoid"
            or list(model.classes_) != [0, 1]):
        raise Unsupported(f"model {model}")
    coefs, intercepts, a, b = [], [], [], []
    for cc in model.calibrated_classifiers_:
        est = cc.estimator
        if (type(est).__name__ != "LinearSVC" or list(est.classes_) != [0, 1] or est.coef_.shape[0] != 1
                or len(cc.calibrators) != 1 or type(cc.calibrators[0]).__name__ != "_SigmoidCalibration"):
            raise Unsupported(f"calibrated classifier {est} {cc.calibrators}")
        coefs.append(np.asarray(est.coef_[0], dtype=np.float64))
        intercepts.append(float(est.intercept_[0]))
        a.append(float(cc.calibrators[0].a_))
        b.append(float(cc.calibrators[0].b_))
    words = [""] * len(vec.vocabulary_)
    for w, i in vec.vocabulary_.items():
        words[i] = w
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / "linear.npz", words=np.array(words), idf=np.asarray(vec.idf_, dtype=np.float64),
             coef=np.stack(coefs), intercept=np.array(intercepts), a=np.array(a), b=np.array(b),
             stop_words=np.array(sorted(vec.get_stop_words() or ())), token_pattern=np.array(vec.token_pattern))


class LinearProfanity:
    """``predict_prob`` from the extracted arrays: TF-IDF (word counts in a document's first-occurrence order,
    sorted by feature index, times the IDF, L2-normalised), each classifier's ``x . coef + intercept`` summed in
    feature order, its sigmoid ``1 / (1 + exp(a * s + b))``, and the mean of the five probabilities in classifier
    order: scikit-learn's operations in its order, so the same doubles."""

    def __init__(self, path: Path) -> None:
        with np.load(path, allow_pickle=False) as z:
            self.vocab = {str(w): i for i, w in enumerate(z["words"].tolist())}
            self.idf: list[float] = z["idf"].tolist()
            self.coef: list[list[float]] = z["coef"].tolist()
            self.intercept: list[float] = z["intercept"].tolist()
            self.a: list[float] = z["a"].tolist()
            self.b: list[float] = z["b"].tolist()
            self.stop_words = frozenset(z["stop_words"].tolist())
            self.token = re.compile(str(z["token_pattern"]))

    def features(self, doc: str) -> list[tuple[int, float]]:
        counts: dict[int, int] = {}
        for tok in self.token.findall(doc.lower()):
            if tok in self.stop_words:
                continue
            j = self.vocab.get(tok)
            if j is not None:
                counts[j] = counts.get(j, 0) + 1
        row = [(j, float(c) * self.idf[j]) for j, c in sorted(counts.items())]
        sq = 0.0
        for _, v in row:
            sq += v * v
        if sq == 0.0:
            return row
        norm = math.sqrt(sq)
        return [(j, v / norm) for j, v in row]

    def prob(self, doc: str) -> float:
        row = self.features(doc)
        mean = 0.0
        for coef, intercept, a, b in zip(self.coef, self.intercept, self.a, self.b):
            s = 0.0
            for j, v in row:
                s += v * coef[j]
            s = s + intercept
            p = 1.0 / (1.0 + math.exp(a * s + b))  # scipy's expit(-(a * s + b)) = 1 / (1 + exp(-x))
            if 1.0 < p <= 1.0 + 1e-5:
                p = 1.0
            mean += p
        return mean / len(self.coef)

    def __call__(self, texts: Sequence[str]) -> list[float]:
        return [self.prob(t) for t in texts]


def cache_dir() -> Path:
    """Keyed by the versions of the package (its pickled pipeline) and of scikit-learn (which computed it)."""
    pkg = importlib.metadata.version(PACKAGE)
    sk = importlib.metadata.version("scikit-learn")
    return cache_root() / "toxicity" / f"profanity_check_{pkg}_sklearn_{sk}_f{FORMAT}"


def load_predictor() -> Callable[[list[str]], Any]:
    """A ``texts -> probabilities`` function equal to ``profanity_check.predict_prob``: the extracted linear model
    (extracted on first use), else ``predict_prob`` itself. ImportError when the package is not installed."""
    try:
        target = cache_dir()
    except importlib.metadata.PackageNotFoundError as err:
        raise ImportError(str(err)) from None
    if (target / "UNSUPPORTED").is_file():
        return _sklearn_predict_prob()

    def build(tmp: Path) -> None:
        try:
            extract(tmp)
        except Unsupported as err:
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "UNSUPPORTED").write_text(f"{err}\n")

    build_once(target, build, "the toxicity classifier's arrays", log=False)
    if (target / "UNSUPPORTED").is_file():
        return _sklearn_predict_prob()
    return LinearProfanity(target / "linear.npz")
