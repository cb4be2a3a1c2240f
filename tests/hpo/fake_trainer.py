"""A stand-in trainer that speaks the trial contract (argv + env + JSONL metrics) without torch.

    python tests/hpo/fake_trainer.py train --config NAME [--metrics-file PATH] [key=value ...]
    python tests/hpo/fake_trainer.py prepare --config NAME [key=value ...]

Trainer keys read: trainer.total_training_steps (10), trainer.test_freq (2), trainer.val_before_train (true),
trainer.seed (1).
Behaviour keys (all optional):
    fake.x              final eval/reward_mean = 1 - (x - 0.3)^2, reached linearly over the run (default 0.3)
    fake.std            eval/reward_std at every evaluation (default 0.2)
    fake.step_s         seconds per step (default 0.02)
    fake.crash_at       raise RuntimeError at this step
    fake.oom_at         raise MemoryError at this step
    fake.sigkill_at     SIGKILL itself at this step (what the kernel OOM killer looks like)
    fake.hang_at        sleep forever at this step
    fake.alloc_mb       allocate (and touch) this many MB at every step
    fake.child          spawn a sleeping grandchild: 'group' (same process group) or 'session' (escapes it)
    fake.ignore_sigterm ignore SIGTERM (the driver must escalate to SIGKILL)
    fake.exit_code      exit with this code after the last step
    fake.bad            exit 2 with 'error: ...' (bad config)
    fake.tox            eval/toxicity_mean at every evaluation (default 0.1)
    fake.lat            eval/latency_p95 at every evaluation (default 0.5)
    fake.throughput     perf/throughput (a throughput study's metric) at every training step (default: not logged)
    fake.throughput_jitter  the run's throughput times 1 + jitter * u, u in [-1, 1] drawn from trainer.seed and the
                        throughput (a noisy host: two settings' runs on one seed differ by more than their settings)
    fake.env_file       write {"argv": [its overrides], "env": {VERL_HPO_SECRET_* and *_KEY / *_TOKEN variables}} (JSON)
    fake.log_file       append {"trial", "cuda", "x", "seed", "start", "end"} (JSON line) to this file when the run ends
    fake.seed_noise     add seed_noise * u to the final value, u in [-1, 1] drawn from trainer.seed (default 0)
    fake.nan_at         actor/pg_loss is NaN from this step on (finite, 0.1, before)
    fake.rollout_noise  step 1's actor/grad_norm is fake.grad_scale x (1 + rollout_noise x u), u in [-1, 1] drawn by the
                        run's "rollout": at random, unless $VERL_HPO_FIRST_ROLLOUT_REPLAY holds a recorded u; with
                        $VERL_HPO_FIRST_ROLLOUT_RECORD the run records its u there; either way it reports what it did
                        in $VERL_HPO_FIRST_ROLLOUT_REPORT (as verl's in-process module does); fake.ignore_first_rollout
                        =true: ignores all three (a trainer that does not know them)
    fake.grad_scale     multiplies step 1's actor/grad_norm (a change of the update a study declares neutral)
    fake.peak_at        eval/reward_mean rises until this step and stays at that value after it
    fake.gate_at        at this step, wait while the file fake.gate_file exists (a test holds a trial mid-run)
    fake.gate_from_run  the gate holds only once fake.log_file records this many finished runs (default 0)
    fake.gate_max_s     the gate holds at most this many seconds (default: no bound)
    fake.model          small | large (default large): which size of a model family the run trains (a proxy search,
                        study.fidelity.proxy); the small one runs each step in fake.small_step_s and scores
                        1 - (x - fake.small_x0)^2, or with fake.small_reverse=true (x - fake.small_x0)^2: the large
                        model's ranking reversed
    fake.small_step_s   seconds per step of the small model (default fake.step_s / 4)
    fake.small_x0       the small model's best x (default 0.3: the large model's)
    fake.small_reverse  true: the small model ranks every x the other way round (default false)
    fake.small_flat_seed on this trainer.seed the small model scores 0.9 whatever x (every setting tied there)
    fake.small_blind_until up to this step the small model's eval/reward_mean is the same whatever x (the curve of a
                        final 0.9), then its own: a proxy that cannot tell settings apart early in a run
    data.test_files     when set (not null): test/reward_mean = the final value + fake.test_offset (default -0.05) at
                        the last step, as verl_core logs its held-out split
Checkpoints, as verl_core keeps them (a resumable backend of the tests drives them; the custom command ignores them):
    trainer.save_freq   > 0: at every multiple of it (and the last step) save <trainer.default_local_dir>/global_step_N
                        (state.pt: {"step": N}; written under a temporary name and renamed) before the step's line
    trainer.resume_mode resume_path: continue from trainer.resume_from_path (its state.pt read as JSON; exit 1 when it
                        is not there) at its step + 1; the curve is a function of the step, so a continued run logs
                        what an uninterrupted one would; fake.log_file's line gets "from": the step it continued
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time


def _first_rollout(opts: dict[str, str]) -> float:
    """The first step's "rollout" (a number in [-1, 1]): replayed, recorded or drawn (fake.rollout_noise)."""
    env = {} if opts.get("fake.ignore_first_rollout") == "true" else os.environ
    record, replay, report = (env.get(f"VERL_HPO_FIRST_ROLLOUT_{k}") for k in ("RECORD", "REPLAY", "REPORT"))
    done = {"recorded": 0, "replayed": 0, "missed": 0}
    u = None
    if replay:
        try:
            u = json.loads(open(os.path.join(replay, "rollout.json")).read())["u"]
            done["replayed"] = 1
        except (OSError, ValueError, KeyError):
            done["missed"] = 1
    if u is None:
        u = random.Random().uniform(-1, 1)
        if record and not replay:
            os.makedirs(record, exist_ok=True)
            with open(os.path.join(record, "rollout.json"), "w") as f:
                f.write(json.dumps({"u": u}))
            done["recorded"] = 1
    if report:
        os.makedirs(report, exist_ok=True)
        with open(os.path.join(report, f"{os.getpid()}.json"), "w") as f:
            f.write(json.dumps(done))
    return float(u)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("train", "prepare"):
        print("error: expected train or prepare", file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    metrics, opts = None, {}
    i = 0
    while i < len(rest):
        if rest[i] in ("--config", "--metrics-file"):
            if rest[i] == "--metrics-file":
                metrics = rest[i + 1]
            i += 2
            continue
        key, _, value = rest[i].partition("=")
        opts[key] = value
        i += 1
    if cmd == "prepare":
        marker = os.environ.get("FAKE_PREPARE_MARKER")
        if marker:
            with open(marker, "a") as fh:
                fh.write("prepared\n")
        return 0
    if "fake.bad" in opts:
        print(f"error: fake.bad={opts['fake.bad']!r} is not a valid option", file=sys.stderr)
        return 2
    if "fake.env_file" in opts:  # what a secret reaches the trainer as (tests/hpo/experiment/test_secrets.py)
        with open(opts["fake.env_file"], "w") as fh:
            env = {k: v for k, v in os.environ.items() if k.startswith("VERL_HPO_SECRET_")
                   or k.endswith(("_KEY", "_TOKEN"))}
            json.dump({"argv": [f"{k}={v}" for k, v in opts.items()], "env": env}, fh)
    if opts.get("fake.ignore_sigterm") == "true":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "fake.child" in opts:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=opts["fake.child"] == "session")
    total = int(opts.get("trainer.total_training_steps", 10))
    freq = int(opts.get("trainer.test_freq", 2))
    val0 = opts.get("trainer.val_before_train", "true") == "true"
    x = float(opts.get("fake.x", 0.3))
    std = float(opts.get("fake.std", 0.2))
    step_s = float(opts.get("fake.step_s", 0.02))
    seed = int(opts.get("trainer.seed", 1))
    final = 1.0 - (x - 0.3) ** 2 + float(opts.get("fake.seed_noise", 0.0)) * random.Random(seed).uniform(-1, 1)
    if opts.get("fake.model") == "small":  # the proxy of a model family: faster, and its own ranking of x
        step_s = float(opts.get("fake.small_step_s", step_s / 4))
        gap = (x - float(opts.get("fake.small_x0", 0.3))) ** 2
        final = gap if opts.get("fake.small_reverse") == "true" else 1.0 - gap
        if str(seed) == opts.get("fake.small_flat_seed"):  # a proxy that cannot tell settings apart on this seed
            final = 0.9
    nan_at = int(opts["fake.nan_at"]) if "fake.nan_at" in opts else None
    hog: list[bytearray] = []
    started = time.time()
    path = metrics or os.environ.get("VERL_FILE_LOGGER_PATH", "metrics.jsonl")
    first = 0 if val0 else 1
    if opts.get("trainer.resume_mode") == "resume_path":
        try:
            with open(os.path.join(opts["trainer.resume_from_path"], "state.pt")) as state:
                first = int(json.load(state)["step"]) + 1
        except (OSError, ValueError, KeyError) as err:
            print(f"error: cannot resume from {opts.get('trainer.resume_from_path')}: {err}", file=sys.stderr)
            return 1
    save_freq = int(opts.get("trainer.save_freq", -1))
    with open(path, "a") as fh:
        for step in range(first, total + 1):
            if step:
                time.sleep(step_s)
            if str(step) == opts.get("fake.crash_at"):
                raise RuntimeError(f"fake crash at step {step}")
            if str(step) == opts.get("fake.oom_at"):
                raise MemoryError(f"fake OOM at step {step}")
            if str(step) == opts.get("fake.sigkill_at"):
                os.kill(os.getpid(), signal.SIGKILL)
            if str(step) == opts.get("fake.hang_at"):
                time.sleep(3600)
            if str(step) == opts.get("fake.gate_at") and _runs_logged(opts) >= int(opts.get("fake.gate_from_run", 0)):
                until = time.monotonic() + float(opts.get("fake.gate_max_s", "inf"))
                while os.path.exists(opts["fake.gate_file"]) and time.monotonic() < until:
                    time.sleep(0.05)
            if "fake.alloc_mb" in opts:
                block = bytearray(int(float(opts["fake.alloc_mb"]) * 2**20))
                block[:: 4096] = b"x" * len(block[:: 4096])
                hog.append(block)
            data: dict[str, float] = {"critic/score/mean": final * step / total, "timing_s/step": step_s,
                                      "actor/pg_loss": float("nan") if nan_at is not None and step >= nan_at else 0.1}
            if step == 1 and "fake.rollout_noise" in opts:
                data["actor/grad_norm"] = float(opts.get("fake.grad_scale", 1.0)) * (
                    1.0 + float(opts["fake.rollout_noise"]) * _first_rollout(opts))
            if step and "fake.throughput" in opts:
                jitter = float(opts.get("fake.throughput_jitter", 0.0))
                data["perf/throughput"] = float(opts["fake.throughput"]) * (
                    1.0 + jitter * random.Random(f"{seed}:{opts['fake.throughput']}").uniform(-1, 1))
            if (step == 0 and val0) or (step and freq > 0 and step % freq == 0) or step == total:
                blind = opts.get("fake.model") == "small" and step <= int(opts.get("fake.small_blind_until", -1))
                data["eval/reward_mean"] = (0.9 if blind else final) * (
                    min(step, int(opts.get("fake.peak_at", total))) + 1) / (total + 1)
                data["eval/reward_std"] = std
                data["eval/toxicity_mean"] = float(opts.get("fake.tox", 0.1))
                data["eval/latency_p95"] = float(opts.get("fake.lat", 0.5))
            if step == total and opts.get("data.test_files", "null") != "null":
                data["test/reward_mean"] = final + float(opts.get("fake.test_offset", -0.05))
            if step and save_freq > 0 and (step % save_freq == 0 or step == total):
                _save(opts["trainer.default_local_dir"], step)
            fh.write(json.dumps({"step": step, "data": data}) + "\n")
            fh.flush()
    if "fake.log_file" in opts:
        with open(opts["fake.log_file"], "a") as log:
            log.write(json.dumps({"trial": os.environ.get("VERL_HPO_TRIAL"), "cuda": os.environ.get(
                "CUDA_VISIBLE_DEVICES"), "x": x, "seed": seed, "start": started, "end": time.time(),
                "from": first}) + "\n")
    return int(opts.get("fake.exit_code", 0))


def _save(root: str, step: int) -> None:
    """A checkpoint of ``step`` under ``root``, whole or not at all (a temporary directory renamed into place)."""
    tmp, final = os.path.join(root, f".global_step_{step}.tmp"), os.path.join(root, f"global_step_{step}")
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "state.pt"), "w") as fh:
        fh.write(json.dumps({"step": step}))
    os.rename(tmp, final)


def _runs_logged(opts: dict[str, str]) -> int:
    """How many finished runs ``fake.log_file`` records (0 without one)."""
    path = opts.get("fake.log_file")
    if not path or not os.path.exists(path):
        return 0
    with open(path) as fh:
        return sum(1 for line in fh if line.strip())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
