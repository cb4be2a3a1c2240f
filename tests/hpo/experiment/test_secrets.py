"""Secrets (issue 44 item 5): a fixed override or ``trial.env`` variable named for a token, password, secret or API key
reaches the trial through its environment, never its argv, and is in none of: the driver's output, ``command.json``,
``config.yaml``, the study's storage, the dashboard, ``best --format command``. A resume reads it from the driver's
environment, and says so in one line when it is not there. A secret is never tuned."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest

from hpo.experiment._secrets import is_secret_key, masked_raw, missing_secrets, secret_env_name
from hpo.experiment._space import StudySpec
from hpo.experiment._tracking import parse_tracking, redact_uri
from hpo.storages import mask_url, open_storage, scrub
from tests.hpo.conftest import PY, cli_env, fake_space, run_cli, write

TOKEN, KEY = "hf_s3cr3tT0ken-XYZ", "k3y-4BC-secret-value"


@pytest.mark.parametrize("key, secret", [
    ("hub_token", True), ("HF_TOKEN", True), ("wandb.api_key", True), ("db_password", True), ("x.secret", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("pad_token", False), ("eos_token", False), ("max_num_batched_tokens", False),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", False), ("tokenizer", False), ("use_token_level", False)])
def test_which_keys_name_a_secret(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_the_stored_experiment_holds_references_not_values() -> None:
    raw = {"overrides": {"hub_token": TOKEN, "data.seed": 1, "api_token": "${oc.env:MINE}"},
           "trial": {"env": {"MY_API_KEY": KEY, "OMP_NUM_THREADS": "1"}}}
    stored = masked_raw(raw)
    assert stored["overrides"] == {"hub_token": "${oc.env:VERL_HPO_SECRET_HUB_TOKEN}", "data.seed": 1,
                                   "api_token": "${oc.env:MINE}"}
    assert stored["trial"]["env"] == {"MY_API_KEY": "***", "OMP_NUM_THREADS": "1"}
    assert raw["overrides"]["hub_token"] == TOKEN  # a copy
    assert secret_env_name("+a.hub-token") == "VERL_HPO_SECRET_A_HUB_TOKEN"


def test_a_secret_reaches_the_trial_and_nothing_else(tmp_path: Path) -> None:
    studies, dump = tmp_path / "studies", tmp_path / "env.json"
    space = fake_space(tmp_path, name="sec", overrides={"trainer.total_training_steps": 4, "trainer.test_freq": 2,
                                                        "fake.step_s": 0.01, "fake.hub_token": TOKEN,
                                                        "fake.env_file": str(dump)},
                       study={"n_trials": 1, "pruner": {"type": "none"}}, trial={"env": {"MY_API_KEY": KEY}})
    res = run_cli(["search", "--space", str(space)], studies)
    assert res.returncode == 0, res.stderr
    seen = json.loads(dump.read_text())
    assert "fake.hub_token=${oc.env:VERL_HPO_SECRET_FAKE_HUB_TOKEN}" in seen["argv"]
    assert seen["env"]["VERL_HPO_SECRET_FAKE_HUB_TOKEN"] == TOKEN and seen["env"]["MY_API_KEY"] == KEY
    best = run_cli(["best", "--study", "sec", "--format", "command"], studies)
    assert best.returncode == 0
    assert run_cli(["dashboard", "--study", "sec"], studies).returncode == 0
    for text in (res.stdout, res.stderr, best.stdout, best.stderr):
        assert TOKEN not in text and KEY not in text
    for path in studies.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert TOKEN.encode() not in data and KEY.encode() not in data, path  # db, command.json, config.yaml, html

    resumed = run_cli(["resume", "--study", "sec", "--n-trials", "2"], studies)  # not exported here: one line
    assert resumed.returncode == 2 and len(resumed.stderr.strip().splitlines()) == 1, resumed.stderr
    assert "VERL_HPO_SECRET_FAKE_HUB_TOKEN (overrides.fake.hub_token)" in resumed.stderr
    assert "MY_API_KEY (trial.env.MY_API_KEY)" in resumed.stderr
    resumed = run_cli(["resume", "--study", "sec", "--n-trials", "2"], studies,
                      VERL_HPO_SECRET_FAKE_HUB_TOKEN=TOKEN, MY_API_KEY=KEY)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(dump.read_text())["env"]["VERL_HPO_SECRET_FAKE_HUB_TOKEN"] == TOKEN


def test_a_secret_is_never_tuned(tmp_path: Path) -> None:
    space = fake_space(tmp_path, params={"t": {"key": "fake.api_token", "type": "categorical", "choices": ["a", "b"]}})
    res = run_cli(["search", "--space", str(space)], tmp_path / "studies")
    assert res.returncode == 2 and "params.t.key" in res.stderr and "names a secret" in res.stderr


# ----------------------------------------------------------------------------- issue 53 item 6: out of the rule's reach
BASE_TOKEN, URL_PW, QUERY_PW = "bAs3-t0k3n-5ecret-77", "Us3r1nf0-PW-91", "Qu3ry-PW-secret-62"


def _cli(args: list[str], cwd: Path, studies: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m hpo ARGS`` as a user runs it: from ``cwd``, outside the repository."""
    tail = [] if studies is None else ["--studies-dir", str(studies)]
    return subprocess.run([PY, "-m", "hpo", *args, *tail], cwd=cwd, env=cli_env(**env), capture_output=True,
                          text=True, timeout=300)


def _leaks(texts: list[str], root: Path | None, *secrets: str) -> list[str]:
    """Where any of ``secrets`` shows: in one of ``texts`` (outputs), or a file under ``root``."""
    out = [f"output {i}" for i, t in enumerate(texts) if any(s in t for s in secrets)]
    for path in sorted(root.rglob("*")) if root is not None else []:
        if path.is_file() and any(s.encode() in path.read_bytes() for s in secrets):
            out.append(str(path))
    return out


def test_a_baseline_secret_reaches_its_runs_and_nothing_else(tmp_path: Path) -> None:
    """``study.baseline`` holds ``s.api_token``: its runs get it in their environment (a reference on argv); the
    stored experiment, ``confirm``, the three ``best`` formats, ``command.json`` / ``config.yaml`` and the dashboard
    never show it; a ``confirm`` whose driver lacks it says which variable to export, and launches no baseline run."""
    studies, dump = tmp_path / "studies", tmp_path / "baseline_env.json"
    space = fake_space(tmp_path, name="bsec", overrides={"trainer.total_training_steps": 2, "trainer.test_freq": 1,
                                                         "fake.step_s": 0.0},
                       study={"n_trials": 1, "baseline": {"fake.api_token": BASE_TOKEN, "fake.x": 0.5,
                                                          "fake.env_file": str(dump)},
                              "confirm": {"top_k": 1, "seeds": 1, "reuse_baseline": False}})
    var = "VERL_HPO_SECRET_BASELINE_FAKE_API_TOKEN"
    outs = []
    res = _cli(["search", "--space", str(space)], tmp_path, studies)
    assert res.returncode == 0, res.stderr
    outs += [res.stdout, res.stderr]
    lacking = _cli(["confirm", "--study", "bsec"], tmp_path, studies)
    assert lacking.returncode != 0 and var in lacking.stderr and "Traceback" not in lacking.stderr, lacking.stderr
    assert not dump.exists(), "a baseline run was launched without its secret"
    outs += [lacking.stdout, lacking.stderr]
    res = _cli(["confirm", "--study", "bsec"], tmp_path, studies, **{var: BASE_TOKEN})
    assert res.returncode == 0, res.stderr
    assert "fake.api_token=${oc.env:" + var + "}" in res.stdout  # the verdict names the baseline by its reference
    outs += [res.stdout, res.stderr]
    seen = json.loads(dump.read_text())
    assert "fake.api_token=${oc.env:" + var + "}" in seen["argv"] and seen["env"][var] == BASE_TOKEN
    for fmt in ("overrides", "yaml", "command"):
        res = _cli(["best", "--study", "bsec", "--format", fmt], tmp_path, studies)
        assert res.returncode == 0, res.stderr
        outs += [res.stdout, res.stderr]
    assert (studies / "bsec" / "dashboard.html").is_file()
    assert [p for p in studies.rglob("command.json") if "${oc.env:" + var + "}" in p.read_text()]
    assert _leaks(outs, studies, BASE_TOKEN) == []  # outputs, bsec.db (stored experiment), command.json, html


def test_the_stored_baseline_holds_references() -> None:
    raw = {"study": {"baseline": {"s.api_token": TOKEN, "lr": 0.1, "db_password": "${oc.env:MINE}"}}}
    assert masked_raw(raw)["study"]["baseline"] == {"s.api_token": "${oc.env:VERL_HPO_SECRET_BASELINE_S_API_TOKEN}",
                                                    "lr": 0.1, "db_password": "${oc.env:MINE}"}
    assert raw["study"]["baseline"]["s.api_token"] == TOKEN  # a copy
    stored = masked_raw(raw)["study"]["baseline"]
    assert missing_secrets({}, {}, {"MINE": "x"}, baseline=stored) == \
        ["VERL_HPO_SECRET_BASELINE_S_API_TOKEN (study.baseline.s.api_token)"]


@pytest.mark.parametrize("url, shown", [
    ("https://user:tok3n@mlflow.example/", "https://user:***@mlflow.example/"),
    ("https://tok3n@mlflow.example", "https://***@mlflow.example"),
    ("https://h:5000/?token=tok3n&x=1", "https://h:5000/?token=***&x=1"),
    ("https://h/?access_token=tok3n", "https://h/?access_token=***"),
    ("https://h/?api_key=tok3n;password=tok3n", "https://h/?api_key=***;password=***"),
    ("https://u:p/a?s#s@h/x", "https://u:***@h/x"),  # a password with / ? # unescaped (SQLAlchemy reads it so)
    ("https://a:b@c@h/x", "https://a:***@h/x"),
    ("postgresql://postgres:tok3n@127.0.0.1:5432/test?password=tok3n&sslmode=disable",
     "postgresql://postgres:***@127.0.0.1:5432/test?password=***&sslmode=disable"),
    ("redis://:tok3n@127.0.0.1:6379/0?password=tok3n", "redis://:***@127.0.0.1:6379/0?password=***"),
    ("postgresql://carol@h/db?sslpassword=tok3n", "postgresql://carol@h/db?sslpassword=***"),  # a role is shown
    ("sqlite:////tmp/a@b.db", "sqlite:////tmp/a@b.db"),
])
def test_every_credential_in_a_url_is_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown and redact_uri(url) == shown
    if "tok3n" in url:  # an error text that repeats the URL and the credential itself
        assert "tok3n" not in scrub(f"failed: {url} (password tok3n)", url)


def test_a_storage_url_credential_is_never_shown(tmp_path: Path) -> None:
    """A PostgreSQL URL with a password as userinfo and as ``?password=`` (trust auth takes any): the search's
    output, its dashboard, the storage's records and every file of the study hold neither; a Redis URL's the same in
    the lines that name it (real servers)."""
    pg = f"postgresql://postgres:{URL_PW}@127.0.0.1:5432/test?password={QUERY_PW}"
    redis = f"redis://:{URL_PW}@127.0.0.1:6379/0?password={QUERY_PW}"
    if importlib.util.find_spec("psycopg2") is None or not _up(5432):
        pytest.skip("PostgreSQL is not reachable")
    space = fake_space(tmp_path, overrides={"trainer.total_training_steps": 2, "trainer.test_freq": 1,
                                            "fake.step_s": 0.0}, study={"n_trials": 1})
    name, studies, outs = f"sec-{uuid.uuid4().hex[:8]}", tmp_path / "studies", []
    try:
        res = _cli(["search", "--space", str(space), "--study", name, "--storage", pg], tmp_path, studies)
        assert res.returncode == 0, scrub(res.stderr, pg)
        assert "postgresql://postgres:***@127.0.0.1:5432/test?password=***" in res.stdout
        outs += [res.stdout, res.stderr]
        study = optuna.load_study(study_name=name, storage=open_storage(pg, StudySpec()))
        outs.append(json.dumps([study.user_attrs, study._storage.get_study_system_attrs(study._study_id),
                                [[t.user_attrs, t.system_attrs] for t in study.trials]], default=str))
    finally:
        try:
            optuna.delete_study(study_name=name, storage=open_storage(pg, StudySpec()))
        except Exception:  # noqa: BLE001 - best-effort cleanup of a shared server
            pass
    assert (studies / name / "dashboard.html").is_file()
    for url in (pg, redis) if importlib.util.find_spec("redis") is not None and _up(6379) else (pg,):
        nosuch = _cli(["dashboard", "--study", "nosuch", "--storage", url], tmp_path, studies)
        assert nosuch.returncode != 0 and "?password=***" in nosuch.stderr, scrub(nosuch.stderr, url)
        outs += [nosuch.stdout, nosuch.stderr]
    assert _leaks(outs, studies, URL_PW, QUERY_PW) == []


def _up(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("uri", [f"https://user:{TOKEN}@127.0.0.1:9", f"https://{TOKEN}@127.0.0.1:9",
                                 f"https://127.0.0.1:9/?token={TOKEN}", f"http://127.0.0.1:9/?access_token={TOKEN}",
                                 f"http://127.0.0.1:9/?password={TOKEN}", f"http://127.0.0.1:9/?api_key={TOKEN}"])
def test_an_mlflow_uri_credential_in_the_file_is_refused(uri: str) -> None:
    def error(where: str, msg: str) -> Exception:
        return ValueError(f"{where}: {msg}")

    with pytest.raises(ValueError) as info:
        parse_tracking({"mlflow": {"uri": uri}}, error)
    line = str(info.value)
    assert TOKEN not in line and "tracking.mlflow.uri" in line and "environment variable" in line


def test_an_mlflow_uri_credential_is_never_shown_or_stored(tmp_path: Path) -> None:
    """In the file: refused with one line (nothing created); on ``--tracking`` (never stored): shown masked."""
    studies = tmp_path / "studies"
    space = fake_space(tmp_path, tracking={"mlflow": {"uri": f"https://{TOKEN}@127.0.0.1:9"}})
    res = _cli(["search", "--space", str(space)], tmp_path, studies)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "MLFLOW_TRACKING_TOKEN" in res.stderr and not studies.exists()
    plain = fake_space(tmp_path, name="plain")
    flag = _cli(["search", "--space", str(plain), "--tracking", f"mlflow=https://{TOKEN}@127.0.0.1:9/?token={KEY}"],
                tmp_path, studies)
    assert flag.returncode == 2 and "https://***@127.0.0.1:9/?token=***" in flag.stderr, flag.stderr
    assert _leaks([res.stdout, res.stderr, flag.stdout, flag.stderr], tmp_path / "studies", TOKEN, KEY) == []


@pytest.mark.parametrize("section", [
    {"overrides": {"fake.hub_token": {"a": TOKEN}}}, {"overrides": {"fake.hub_token": [TOKEN]}},
    {"study": {"baseline": {"fake.api_token": {"a": TOKEN}}}}, {"study": {"baseline": {"fake.api_token": [TOKEN]}}},
    {"trial": {"env": {"MY_API_KEY": {"a": TOKEN}}}},
], ids=["override-mapping", "override-list", "baseline-mapping", "baseline-list", "env-mapping"])
def test_a_secret_given_a_mapping_or_list_is_refused_by_key(tmp_path: Path, section: dict[str, Any]) -> None:
    res = _cli(["validate", "--space", str(fake_space(tmp_path, **section))], tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert TOKEN not in res.stderr and "names a secret" in res.stderr


def test_a_secret_is_not_echoed_by_an_override_or_a_trainer_check(tmp_path: Path) -> None:
    space = fake_space(tmp_path)
    res = _cli(["validate", "--space", str(space), "--override", f"fake.hub_token={{a: {TOKEN}}}"], tmp_path)
    assert res.returncode == 2 and TOKEN not in res.stderr and "fake.hub_token" in res.stderr, res.stderr
    core = write(tmp_path / "core.yaml", f"""\
        config: tiny_arith
        overrides: {{hub_token: {TOKEN}}}
        params: {{lr: {{key: actor_rollout_ref.actor.optim.lr, type: float, low: 1.0e-6, high: 1.0e-5}}}}
        trial: {{backend: verl_core}}
        """)
    res = _cli(["validate", "--space", str(core)], tmp_path)
    assert res.returncode == 2 and "overrides.hub_token" in res.stderr and TOKEN not in res.stderr, res.stderr


def test_the_tracking_process_output_is_scrubbed() -> None:
    """The tracking process's stdout and stderr (where MLflow prints its URI in run links) hold no credential."""
    import io

    from hpo.tracking._sync import _Scrubbed

    inner = io.StringIO()
    out = _Scrubbed(inner, ["tok3n", "", "pw"])
    out.write("View run at https://tok3n@h/#/runs/1 (pw)\n")
    assert inner.getvalue() == "View run at https://***@h/#/runs/1 (***)\n" and out.getvalue() == inner.getvalue()
