"""When and how the study's page (:mod:`hpo.reporting._page`, ``studies/<study>/dashboard.html``) is written: every
few finished trials of a search (:class:`DashboardCallback`) and once more when it ends (:func:`write_final_page`),
each time in a process of its own (``python -m hpo.reporting._dashboard``, :func:`page_process`: plotly and
scikit-learn stay out of the driver, the storage URL out of argv), and by ``verl-hpo dashboard``
(:func:`dashboard_command`). A page that cannot be written is a note or a warning, never an error of the search.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from hpo.reporting._page import write_dashboard
from hpo.storages import mask_url
from hpo.study import quiet_optuna


def dashboard_path(studies_dir: Path, study_name: str) -> Path:
    return studies_dir / study_name / "dashboard.html"


def write_final_page(callback: DashboardCallback, study_name: str, storage_url: str, studies_dir: Path,
                     note: Callable[[str], None]) -> None:
    """After a run: the in-flight page write finishes, then the page is written once more (in a process of its own:
    plotly and its kin stay out of the driver); a failure is a note, never an error of the search."""
    callback.wait(60)
    page = dashboard_path(studies_dir, study_name)
    try:
        write_page_apart(study_name, storage_url, studies_dir, page)
        note(f"dashboard: {page}")
    except Exception as err:  # noqa: BLE001 - the page must never fail a search
        note(f"dashboard not written: {type(err).__name__}: {err}")


ENV_STORAGE = "VERL_HPO_PAGE_STORAGE"  # the storage URL reaches the page's process in its environment, not argv
PAGE_TIMEOUT_S = 300.0


def page_process(study_name: str, storage_url: str, studies_dir: Path | None, out: Path) -> subprocess.Popen[str]:
    """Start ``python -m hpo.reporting._dashboard`` writing ``out``: the page's imports (plotly, Optuna's plots and
    importances) and its seconds of work stay out of the driver's process. The storage URL goes in
    the environment (argv is world-readable in ``ps``); stderr is the caller's to read."""
    env = dict(os.environ)
    env[ENV_STORAGE] = storage_url
    root = str(Path(__file__).resolve().parents[2])  # the directory holding the hpo package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-m", "hpo.reporting._dashboard", study_name, str(out)]
    if studies_dir is not None:
        argv.append(str(studies_dir))
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def write_page_apart(study_name: str, storage_url: str, studies_dir: Path | None, out: Path,
                     timeout: float = PAGE_TIMEOUT_S) -> None:
    """:func:`page_process` and wait for it; RuntimeError with its last stderr line when it fails."""
    proc = page_process(study_name, storage_url, studies_dir, out)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"the page took over {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError((err.strip().splitlines() or [f"exit {proc.returncode}"])[-1])


class DashboardCallback:
    """After-trial callback: rewrite the page every ``every`` finished trials, in a process of its own
    (:func:`page_process`: the trial loop never waits for it and the driver never loads plotly or scikit-learn;
    a write still running is not started twice). Never raises (a broken page must not stop a search): the first
    problem is printed once to stderr."""

    def __init__(self, out: Path, storage_url: str, studies_dir: Path | None = None, every: int = 5) -> None:
        self.out, self.storage_url, self.studies_dir, self.every = out, storage_url, studies_dir, max(1, every)
        self._lock = threading.Lock()
        self._count = 0
        self._warned = False
        self._proc: subprocess.Popen[str] | None = None

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        with self._lock:
            self._count += 1
            if self._count % self.every or not self._reap(block=False):
                return
            try:
                self._proc = page_process(study.study_name, self.storage_url, self.studies_dir, self.out)
            except OSError as err:
                self._warn(f"{type(err).__name__}: {err}")

    def wait(self, timeout: float | None = None) -> None:
        """Until the write in flight (if any) is done (killed after ``timeout``)."""
        with self._lock:
            if self._proc is not None:
                try:
                    self._proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                self._reap(block=True)

    def _reap(self, block: bool) -> bool:
        """Whether no write is in flight (reading the finished one's outcome)."""
        proc = self._proc
        if proc is None:
            return True
        if not block and proc.poll() is None:
            return False
        _, err = proc.communicate()
        self._proc = None
        if proc.returncode != 0:
            self._warn((err.strip().splitlines() or [f"exit {proc.returncode}"])[-1])
        return True

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            print(f"warning: dashboard not written: {why}", file=sys.stderr)


def dashboard_command(study_name: str, storage_url: str, studies_dir: Path, out: Path | None = None) -> int:
    """``verl-hpo dashboard``: load the study (read only) and write its page; prints the path."""
    from hpo.experiment import StudySpec
    from hpo.storages import open_storage, study_exists

    quiet_optuna()
    storage = open_storage(storage_url, StudySpec())
    if not study_exists(storage, study_name):
        print(f"error: no study {study_name!r} in {mask_url(storage_url)}", file=sys.stderr)
        return 2
    study = optuna.load_study(study_name=study_name, storage=storage)
    path = write_dashboard(study, out or dashboard_path(studies_dir, study_name), storage_url=storage_url,
                           studies_dir=studies_dir)
    print(path)
    return 0


def _main(argv: list[str]) -> int:
    """``python -m hpo.reporting._dashboard STUDY OUT [STUDIES_DIR]`` with the storage URL in ``$VERL_HPO_PAGE_STORAGE``
    (:func:`page_process`); one line on stderr and exit 1 when the page cannot be written."""
    from hpo.experiment import StudySpec
    from hpo.storages import open_storage, scrub

    study_name, out = argv[0], Path(argv[1])
    studies_dir = Path(argv[2]) if len(argv) > 2 else None
    url = os.environ.get(ENV_STORAGE, "")
    quiet_optuna()
    # The page draws with plotly, and its importances are PED-ANOVA's (Optuna's default evaluator: numpy only). Yet
    # importing optuna.visualization and optuna.importance also imports Optuna's matplotlib plots and its fANOVA and
    # MDI evaluators, which load matplotlib.pyplot and scikit-learn (with SciPy) wherever they are installed (MLflow
    # brings matplotlib): more than half of this process's time. It uses neither, so they fail to import here and
    # Optuna marks those plots and evaluators unavailable.
    for unused in ("matplotlib", "sklearn"):
        sys.modules.setdefault(unused, None)  # type: ignore[arg-type]
    try:
        study = optuna.load_study(study_name=study_name, storage=open_storage(url, StudySpec()))
        write_dashboard(study, out, storage_url=url, studies_dir=studies_dir)
    except Exception as err:  # noqa: BLE001 - one line for the driver, never a password
        print(scrub(f"{type(err).__name__}: {err}".splitlines()[0], url), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
