"""Hostile and unlucky input to the driver: study names, storage passwords, limits that would switch themselves off,
signals at awkward moments. (Stored experiments that run code: ``tests/hpo/experiment/test_trust.py``.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from hpo.storages._storage import check_study_name
from hpo.study._optuna import ATTR_SPACE
from tests.hpo.conftest import PY, ROOT, cli_env, fake_space, load, run_cli


def one_line_exit(res: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``verl-hpo ARGS`` through the CLI's own ``main`` in this process: its exit code and what it printed. For input
    refused before any study or trial exists (no process to stop, nothing that blocks, no storage or Optuna call whose
    log handler could write past ``capsys``; hpo itself logs nothing there): a driver start each costs seconds on a
    busy host. A traceback would be an exception here, and fail the test as it would the command line's one-line
    check; ``python -m hpo`` itself refusing in one line is checked in subprocesses (a study name once, the YAML bomb,
    the FIFOs, the user code)."""
    from hpo._cli import main

    capsys.readouterr()
    try:
        code = main(args)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


# ----------------------------------------------------------------------------- study names and paths
@pytest.mark.parametrize("name", ["../../esc", "/abs/dir", ".hidden", "a/b", "-rf", "", "x" * 101, "..", "a b"])
def test_unsafe_study_names_are_refused_before_anything_is_written(tmp_path: Path, name: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "deep" / "er"
    work.mkdir(parents=True)
    studies = work / "studies"
    cmds = [["search", "--space", str(fake_space(tmp_path)), f"--study={name}"], ["resume", f"--study={name}"]]
    if name in ("../../esc", "/abs/dir"):  # every command checks the name the same way (one function)
        cmds += [["best", f"--study={name}"], ["dashboard", f"--study={name}"], ["worker", f"--study={name}"]]
    for cmd in cmds:
        line = one_line_exit(in_process([*cmd, "--studies-dir", str(studies)], capsys))
        assert "study name" in line
    if name == "../../esc":  # and so does the command line (python -m hpo) itself
        assert "study name" in one_line_exit(run_cli(cmds[0], studies))
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["deep", "er", "fake.yaml"])


@pytest.mark.parametrize("name", ["kl_lr", "run-2.v1", "A", "9lives"])
def test_safe_study_names_pass(name: str) -> None:
    assert check_study_name(name) == name


def test_a_directory_the_driver_did_not_create_is_never_deleted(tmp_path: Path, studies: Path) -> None:
    user_dir = studies / "fake" / "trials" / "0"
    user_dir.mkdir(parents=True)
    (user_dir / "precious.txt").write_text("mine")
    res = run_cli(["search", "--space", str(fake_space(tmp_path, study={"n_trials": 1}))], studies)
    line = one_line_exit(res, 1)
    assert "was not created by verl-hpo" in line
    assert (user_dir / "precious.txt").read_text() == "mine"


def test_a_leftover_trial_directory_of_the_driver_is_replaced(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    marker = studies / "fake" / "trials" / "0" / ".verl-hpo-trial"
    assert json.loads(marker.read_text())["trial"] == 0
    # the same study made again from scratch (its database removed): trial 0's directory is the driver's own
    (studies / "fake.db").unlink()
    (studies / "fake" / "trials" / "0" / "stale.txt").write_text("old attempt")
    assert run_cli(["search", "--space", str(space)], studies).returncode == 0
    assert not (studies / "fake" / "trials" / "0" / "stale.txt").exists()


def test_dashboard_out_is_the_users_path_to_choose(tmp_path: Path, studies: Path) -> None:
    """A path typed on the user's own command line may be anywhere (``--out ~/report.html``); what comes from
    storage (the study name) still never escapes the studies directory (tests above)."""
    assert run_cli(["search", "--space", str(fake_space(tmp_path, study={"n_trials": 1}))], studies).returncode == 0
    outside = tmp_path / "elsewhere" / "report.html"
    res = run_cli(["dashboard", "--study", "fake", "--out", str(outside)], studies)
    assert res.returncode == 0, res.stderr
    assert outside.is_file() and "<html" in outside.read_text()[:2000].lower()
    assert res.stdout.strip() == str(outside)
    line = one_line_exit(run_cli(["dashboard", "--study", "fake", "--out", str(tmp_path)], studies))
    assert "--out" in line and "directory" in line


# ----------------------------------------------------------------------------- limits
@pytest.mark.parametrize("override", ["trial.timeout_s=.nan", "trial.memory_limit_gb=.nan", "trial.timeout_s=.inf",
                                      "trial.timeout_s=-5", "trial.memory_limit_gb=-1", "params.x.high=.nan"])
def test_limits_that_would_switch_themselves_off_are_one_line_errors(tmp_path: Path, studies: Path, override: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    res = in_process(["search", "--space", str(fake_space(tmp_path)), "--override", override, "--studies-dir",
                      str(studies)], capsys)
    line = one_line_exit(res)
    assert override.split("=")[0] in line
    assert not studies.exists() or not list(studies.iterdir())


# ----------------------------------------------------------------------------- passwords
def _psql(sql: str, db: str = "test") -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-qc", sql],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture
def pg_role_with_password() -> tuple[str, str]:
    """A real PostgreSQL role with a password, owning a database of its own (dropped afterwards)."""
    if shutil.which("psql") is None:
        pytest.skip("psql not installed")
    try:
        _psql("select 1")
    except (subprocess.SubprocessError, OSError):
        pytest.skip("PostgreSQL is not running on 127.0.0.1:5432")
    role, password = f"hpo_pw_{uuid.uuid4().hex[:8]}", "S3cretPW_" + uuid.uuid4().hex[:6]
    _psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    _psql(f"CREATE DATABASE {role} OWNER {role}")
    try:
        yield f"postgresql+psycopg2://{role}:{password}@127.0.0.1:5432/{role}", password
    finally:
        _psql(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)")
        _psql(f"DROP ROLE IF EXISTS {role}")


def test_a_storage_password_is_never_shown(tmp_path: Path, studies: Path,
                                           pg_role_with_password: tuple[str, str]) -> None:
    url, password = pg_role_with_password
    space = fake_space(tmp_path, study={"n_trials": 1})
    shown: list[str] = []
    res = run_cli(["search", "--space", str(space), "--storage", url], studies)
    assert res.returncode == 0, res.stderr.replace(password, "***")
    assert "***@127.0.0.1" in res.stdout
    shown += [res.stdout, res.stderr]
    for cmd in (["best", "--study", "fake"], ["dashboard", "--study", "fake"], ["resume", "--study", "fake"],
                ["resume", "--study", "nosuch"], ["dashboard", "--study", "nosuch"]):
        res = run_cli([*cmd, "--storage", url], studies)
        shown += [res.stdout, res.stderr]
    assert "no study 'nosuch'" in shown[-1]
    # a wrong database name: the server's error, masked
    res = run_cli(["best", "--study", "fake", "--storage", url.rsplit("/", 1)[0] + "/nosuchdb"], studies)
    assert res.returncode == 1 and "***" in res.stderr
    shown += [res.stdout, res.stderr]
    shown += [p.read_text(errors="replace") for p in studies.rglob("*") if p.is_file()]
    assert (studies / "fake" / "dashboard.html").is_file()
    assert not [s for s in shown if password in s]


# ----------------------------------------------------------------------------- signals
def _start(space: Path, studies: Path, stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)],
                            cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)


def _wait_for(pred: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_sighup_stops_like_sigterm(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 20, "fake.step_s": 0.3},
                       study={"n_trials": 1})
    driver = _start(space, studies)
    _wait_for(lambda: (studies / "fake" / "trials" / "0" / "metrics.jsonl").exists())
    driver.send_signal(signal.SIGHUP)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 129 and "Traceback" not in err and "resume" in err
    states = [t.state for t in load(studies, "fake").trials]
    assert states == [TrialState.FAIL, TrialState.WAITING]


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path, studies: Path) -> None:
    """The first Ctrl-C asks the trial to stop, and its trainer ignores SIGTERM: that stop takes the wrapper's grace
    (then a SIGKILL), after which the driver records the trial FAIL and queues its retry. The second Ctrl-C does not
    wait for it: the driver is gone with the trial still RUNNING (the next resume recovers it), and the trial's
    processes die with the driver."""
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 1000, "fake.step_s": 0.3,
                                            "fake.ignore_sigterm": True}, study={"n_trials": 1})
    log, trial = tmp_path / "driver.err", studies / "fake" / "trials" / "0"
    with log.open("w") as err:
        driver = _start(space, studies, stderr=err)
    try:
        _wait_for(lambda: (trial / "metrics.jsonl").exists())
        assert _processes_naming(trial)  # the trial's wrapper and trainer
        driver.send_signal(signal.SIGINT)
        _wait_for(lambda: "stopping running trials" in log.read_text())  # the first one is being acted on
        driver.send_signal(signal.SIGINT)
        driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 130 and "SIGINT again: exiting now" in log.read_text(), log.read_text()
    assert [t.state for t in load(studies, "fake").trials] == [TrialState.RUNNING]  # not waited for, not recorded
    _wait_for(lambda: not _processes_naming(trial))


def _processes_naming(path: Path) -> list[int]:
    """The processes whose command line names ``path`` (a trial's wrapper and trainer name its files)."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(path) in " ".join(proc.info["cmdline"] or ()):
            out.append(proc.info["pid"])
    return out


def test_a_signal_after_the_study_is_done_exits_0(tmp_path: Path, studies: Path) -> None:
    space = fake_space(tmp_path, study={"n_trials": 1})
    driver = _start(space, studies)
    assert driver.stdout is not None
    for line in driver.stdout:  # the progress line of the last trial: the study is done, the page is being written
        if "1/1" in line:
            driver.send_signal(signal.SIGTERM)
            break
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 0, err
    assert [t.state for t in optuna.load_study(study_name="fake", storage=f"sqlite:///{studies / 'fake.db'}").trials] \
        == [TrialState.COMPLETE]


# ----------------------------------------------------------------------------- input that would fail late
def run_cmd(cmd: str, args: list[str], studies: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``validate`` writes nothing and takes no --studies-dir; the others do."""
    if cmd != "validate":
        return run_cli([cmd, *args], studies, timeout=timeout)
    return subprocess.run([PY, "-m", "hpo", cmd, *args], cwd=ROOT, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


BILLION_LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.mark.parametrize("cmd", ["validate", "search"])
def test_a_yaml_bomb_is_refused_in_one_line_before_any_study(tmp_path: Path, studies: Path, cmd: str) -> None:
    path = fake_space(tmp_path)
    path.write_text(BILLION_LAUGHS + path.read_text())
    line = one_line_exit(run_cmd(cmd, ["--space", str(path)], studies, timeout=60))
    assert str(path) in line and "aliases" in line
    assert not studies.exists() or not list(studies.iterdir())


def test_yaml_anchors_that_stay_small_still_load(tmp_path: Path, studies: Path) -> None:
    path = fake_space(tmp_path)
    text = path.read_text().replace("trainer.total_training_steps: 10", "trainer.total_training_steps: &steps 10")
    text = text.replace("trainer.test_freq: 2", "trainer.test_freq: 2\n  fake.peak_at: *steps")
    path.write_text(text)
    res = run_cmd("validate", ["--space", str(path)], studies)
    assert res.returncode == 0, res.stderr


def test_a_huge_experiment_file_is_refused(tmp_path: Path, studies: Path) -> None:
    path = fake_space(tmp_path)
    path.write_text(path.read_text() + "# " + "x" * (3 << 20) + "\n")
    line = one_line_exit(run_cli(["search", "--space", str(path)], studies))
    assert str(path) in line and "bytes" in line
    assert not studies.exists() or not list(studies.iterdir())


@pytest.mark.parametrize("where", ["overrides.fake.note", "trial.env.BIG"])
@pytest.mark.parametrize("cmd", ["validate", "search"])
def test_arguments_too_long_to_launch_are_refused_at_load(tmp_path: Path, studies: Path, cmd: str,
                                                          where: str) -> None:
    big = "x" * (130 * 1024)  # over Linux's 128 KiB limit on one argument or environment entry
    space = (fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, "fake.note": big})
             if where.startswith("overrides") else
             fake_space(tmp_path, trial={"command": [PY, "tests/hpo/fake_trainer.py", "train"], "env": {"BIG": big}}))
    line = one_line_exit(run_cmd(cmd, ["--space", str(space)], studies))
    assert where in line and "at most" in line and len(line) < 600
    assert not studies.exists() or not list(studies.iterdir())


def test_a_launch_error_is_not_a_storage_error_and_leaves_no_running_trial(tmp_path: Path, studies: Path) -> None:
    """With a 1 MiB stack limit ARG_MAX is 256 KiB: 300 KB of overrides pass the load check (which allows
    512 KiB) but ``execve`` refuses them. The driver says so in one line, and the trial is queued, not RUNNING."""
    import resource

    big = {f"fake.note{i}": "z" * 100_000 for i in range(3)}
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2, **big},
                       study={"n_trials": 1, "pruner": {"type": "none"}})

    def small_stack() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, 1 << 20))

    res = subprocess.run([PY, "-m", "hpo", "search", "--space", str(space), "--studies-dir", str(studies)], cwd=ROOT,
                         env=cli_env(), capture_output=True, text=True, timeout=120, preexec_fn=small_stack)
    line = one_line_exit(res, 1)
    assert "could not be run" in line and "Argument list too long" in line and "storage" not in line
    trials = load(studies, "fake").trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs["stop_reason"] == "driver_error"
    assert trials[1].params == trials[0].params  # the same parameters are queued for a driver that can run them
    command = studies / "fake" / "trials" / "0" / "command.json"
    assert not command.exists() or command.stat().st_size < 2_000_000


def test_a_study_creation_cut_short_is_repaired_by_the_next_search(tmp_path: Path, studies: Path) -> None:
    """``search`` died right after storing the experiment: the next ``search`` writes the source path and the
    digest that are missing, so that ``resume`` needs no ``--space`` (its trainer command runs code)."""
    from hpo.backends import load_space
    from hpo.study._optuna import ATTR_DIGEST, ATTR_SOURCE, _jsonable

    path = fake_space(tmp_path, study={"n_trials": 2, "pruner": {"type": "none"}})
    space = load_space(str(path))
    studies.mkdir()
    storage = f"sqlite:///{studies / 'fake.db'}"
    study = optuna.create_study(study_name="fake", storage=storage, direction="maximize")
    study.set_user_attr(ATTR_SPACE, _jsonable(space.raw))  # ... and then the driver was killed
    res = run_cli(["search", "--space", str(path), "--n-trials", "1"], studies)
    assert res.returncode == 0, res.stderr
    attrs = load(studies, "fake").user_attrs
    assert attrs[ATTR_SOURCE] == str(path) and len(attrs[ATTR_DIGEST]) == 64
    res = run_cli(["resume", "--study", "fake", "--n-trials", "2"], studies)  # no --space needed
    assert res.returncode == 0, res.stderr
    assert len([t for t in load(studies, "fake").trials if t.state == TrialState.COMPLETE]) == 2


# ----------------------------------------------------------------------------- files a user names
MEASURED = """\
import json, resource, subprocess, sys
def cap():  # on a driver that reads /dev/zero without bound this ends it (MemoryError) instead of the machine
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))
try:
    res = subprocess.run(sys.argv[1:], capture_output=True, text=True, preexec_fn=cap, timeout=120)
    rc, err = res.returncode, res.stderr
except subprocess.TimeoutExpired:  # a driver blocked on open() of a FIFO: one_line_exit then fails on rc None
    rc, err = None, "timed out after 120 s (blocked on the file?)"
print(json.dumps({"rc": rc, "stderr": err,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def run_measured(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m hpo ARGS`` run by a fresh process that reports its peak RSS (its only child's). No wall-clock bound
    (a loaded machine makes any such bound flaky): a driver that blocks on a FIFO is caught by the 120 s timeout, one
    that reads /dev/zero without bound by the peak RSS (or the 2 GiB cap's MemoryError, not a one-line exit 2)."""
    out = subprocess.run([PY, "-c", MEASURED, PY, "-m", "hpo", *args], cwd=ROOT, env=cli_env(), capture_output=True,
                         text=True, timeout=180, check=True)
    m = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, m["rc"], "", m["stderr"]), m["maxrss_mb"]


@pytest.fixture
def odd_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    return {"FIFO": fifo, "character device": zero}


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
@pytest.mark.parametrize("cmd", ["validate", "search"])
def test_an_experiment_file_that_is_a_fifo_or_dev_zero_is_refused_at_once(odd_files: dict[str, Path], studies: Path,
                                                                         cmd: str, kind: str) -> None:
    """A FIFO used to hang ``open()``; a symlink to /dev/zero was read without bound (13.6 GB after 25 s)."""
    path = odd_files[kind]
    args = [cmd, "--space", str(path)] + (["--studies-dir", str(studies)] if cmd == "search" else [])
    res, rss_mb = run_measured(args)
    line = one_line_exit(res)
    assert str(path) in line and f"is a {kind}, not a regular file" in line
    assert rss_mb < 200, rss_mb
    assert not studies.exists()


@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_validate_metrics_that_is_a_fifo_or_dev_zero_is_refused_at_once(tmp_path: Path, odd_files: dict[str, Path],
                                                                       kind: str) -> None:
    res, rss_mb = run_measured(["validate", "--space", str(fake_space(tmp_path)), "--metrics", str(odd_files[kind])])
    line = one_line_exit(res)
    assert f"--metrics {odd_files[kind]}: is a {kind}" in line
    assert rss_mb < 200, rss_mb


def test_a_storage_path_that_is_a_fifo_is_refused(tmp_path: Path, odd_files: dict[str, Path], studies: Path) -> None:
    """(Already refused by the storage check: kept so that it stays so.)"""
    res, _ = run_measured(["search", "--space", str(fake_space(tmp_path)), "--studies-dir", str(studies),
                             "--storage", f"sqlite:///{odd_files['FIFO']}"])
    assert "is not a file" in one_line_exit(res)


@pytest.mark.parametrize("where", ["override", "file", "file, in a value the driver walks"])
def test_a_recursive_yaml_alias_is_one_line(tmp_path: Path, studies: Path, where: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = fake_space(tmp_path)
    args = ["--space", str(path)]
    if where == "override":
        args += ["--override", "s.z=&a [*a]"]
    elif where == "file":
        path.write_text(path.read_text() + "z: &a [*a]\n")
    else:
        path.write_text(path.read_text().replace("fake.step_s: 0.02", "fake.step_s: 0.02\n  fake.z: &a [1, *a]"))
    for cmd in ("validate", "search"):  # (a RecursionError would be an exception here: it fails as a traceback would)
        line = one_line_exit(in_process([cmd, *args] + (["--studies-dir", str(studies)] if cmd != "validate" else []),
                                        capsys))
        assert "alias *a inside the value of &a (a cycle)" in line
        assert ("--override 's.z=&a [*a]'" if where == "override" else f"{path}: line") in line
    assert not studies.exists()


def test_an_argument_list_over_the_limit_names_its_largest_key_not_its_value(tmp_path: Path) -> None:
    """Six 100 KB overrides: over the 512 KiB for a trial's arguments. The line gives sizes and a key, not 600 KB."""
    space = fake_space(tmp_path)
    overrides = [a for i in range(6) for a in ("--override", f"fake.note{i}={'x' * (100_000 - 10 * i)}")]
    line = one_line_exit(run_cmd("validate", ["--space", str(space), *overrides], tmp_path / "studies"))
    assert len(line) < 600, len(line)
    assert "overrides.fake.note0" in line and "(100012 bytes)" in line and "at most 524288" in line
    assert re.search(r"add up to 6\d{5} bytes", line), line


@pytest.mark.parametrize("key", ["custom_reward_function.path", "evaluation.custom"])
@pytest.mark.parametrize("kind", ["FIFO", "character device"])
def test_user_code_that_is_a_fifo_or_dev_zero_is_refused_at_load(tmp_path: Path, odd_files: dict[str, Path],
                                                                 studies: Path, key: str, kind: str) -> None:
    """The trainer (and, for verl, the driver's config check in verl's interpreter) would import it: block on a
    FIFO, or read /dev/zero until memory runs out."""
    code = tmp_path / f"{kind.split()[0].lower()}.py"
    code.symlink_to(odd_files[kind])
    value: object = str(code) if key == "custom_reward_function.path" else [f"mine={code}:score"]
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 4, key: value})
    for cmd in ("validate", "search"):
        line = one_line_exit(run_cmd(cmd, ["--space", str(space)], studies, timeout=60))
        assert f"overrides.{key}" in line and f"{code}: is a {kind}, not a regular file" in line
    assert not studies.exists()
