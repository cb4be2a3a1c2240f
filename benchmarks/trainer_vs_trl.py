"""Item 1: trainer throughput, ours vs TRL, same model / batch / response length / optimizer steps, CPU fp32.

Each measurement is its own subprocess; ours and TRL alternate (A B | B A | ...). Per run the
first (warm-up) step is dropped and the median of the remaining step times is taken; a
repetition's tokens/s is response tokens per step / that median.

* PPO (TRL 1.12 ``trl.experimental.ppo.PPOTrainer``): actor + critic + frozen reference + reward
  model on both sides, KL (k1) in the reward, GAE; 64 prompts x 32 tokens, 1 epoch x 1 mini-batch
  and 4 epochs x 4 mini-batches (one optimizer step per mini-batch; TRL's joint policy+value step
  vs our actor step + critic step).
* GRPO (TRL 1.16 ``GRPOTrainer``): 8 prompts x 8 generations x 32 tokens, one optimizer step per
  generation, k3 KL loss to the reference (beta = kl_loss_coef = 0.04), the arithmetic rule reward.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import (
    REPO,
    TRL112_PY,
    TRL116_PY,
    Row,
    interleave,
    last_json_line,
    log,
    main_python,
    make_row,
    run_measured,
    tail,
)

LR = 1e-5


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # ppo | grpo
    prompts: int
    n: int  # generations per prompt
    response_length: int
    epochs: int = 1
    mini_batches: int = 1

    @property
    def samples(self) -> int:
        return self.prompts * self.n

    @property
    def label(self) -> str:
        if self.kind == "ppo":
            return (f"PPO {self.prompts}x{self.response_length} tok, {self.epochs} ep x {self.mini_batches} mb")
        return f"GRPO {self.prompts}x{self.n} gen x{self.response_length} tok"


FULL_CASES = (
    Case("ppo_1x1", "ppo", 64, 1, 32, 1, 1),
    Case("ppo_4x4", "ppo", 64, 1, 32, 4, 4),
    Case("grpo", "grpo", 8, 8, 32),
)
SMOKE_CASES = (
    Case("ppo_1x1", "ppo", 8, 1, 4, 1, 1),
    Case("grpo", "grpo", 2, 4, 4),
)


def our_overrides(case: Case, assets: dict[str, str], steps: int, threads: int, workdir: Path) -> list[str]:
    mini = case.prompts // case.mini_batches
    o = [
        f"data.train_files={assets['data']}", f"data.val_files={assets['data']}",
        f"data.train_batch_size={case.prompts}", "data.max_prompt_length=16",
        f"data.max_response_length={case.response_length}",
        f"actor_rollout_ref.model.path={assets['policy']}",
        f"actor_rollout_ref.actor.optim.lr={LR}", f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini * case.n}",
        f"actor_rollout_ref.actor.ppo_epochs={case.epochs}", f"actor_rollout_ref.rollout.n={case.n}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.actor.clip_ratio=0.2",
        f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.val_before_train=false",
        f"trainer.cpu_threads={threads}", "trainer.resume_mode=disable", "trainer.save_freq=-1",
        f"trainer.default_local_dir={workdir / 'ckpt'}", "trainer.seed=1",
        "evaluation.toxicity.enable=false", "evaluation.latency.enable=false",
    ]
    if case.kind == "ppo":  # the same work as TRL PPO: critic, reward model, reference + KL in reward
        # TRL's rollout forwards (policy, reference, value, reward) run on local_rollout_forward_batch_size = the
        # whole batch; ours likewise (the reward model scores all samples in one forward by default)
        # TRL's PPO takes the old log-probs from the generation logits: reuse_log_probs does the same
        o += [f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={case.samples}",
              f"critic.forward_micro_batch_size_per_gpu={case.samples}",
              "actor_rollout_ref.rollout.reuse_log_probs=true"]
        o += [f"critic.optim.lr={LR}", "critic.cliprange_value=0.2", "algorithm.adv_estimator=gae",
              "algorithm.gamma=1.0", "algorithm.lam=0.95", "algorithm.use_kl_in_reward=true",
              "algorithm.kl_penalty=kl", "algorithm.kl_ctrl.type=fixed", "algorithm.kl_ctrl.kl_coef=0.05",
              "reward_model.enable=true", f"reward_model.model.path={assets['reward']}"]
    else:
        o += ["algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
              "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.04",
              "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "reward_model.enable=false"]
    return o


def run_ours(case: Case, assets: dict[str, str], steps: int, threads: int, extra_env: dict[str, str] | None = None,
             python: str | None = None, module: str = "verl_core") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as tmp:
        work = Path(tmp)
        metrics = work / "metrics.jsonl"
        argv = [python or main_python(), "-m", module, "train", "--config", "tiny_arith",
                "--metrics-file", str(metrics), *our_overrides(case, assets, steps, threads, work)]
        env = {"PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
        m = run_measured(argv, env=env, cwd=str(REPO))
        if m.returncode != 0:
            raise RuntimeError(f"our trainer failed (exit {m.returncode}):\n{tail(m.stderr)}")
        rows = [json.loads(line)["data"] for line in metrics.read_text().splitlines() if line.strip()]
    step_s = [float(r["timing_s/step"]) for r in rows]
    tokens = [float(r["response_length/mean"]) * case.samples for r in rows]
    return {"step_s": step_s, "tokens": tokens, "peak_rss_gb": m.peak_rss_gb, "wall_s": m.wall_s,
            "score": [r.get("critic/score/mean") for r in rows],
            "stages": {k: [r.get(k) for r in rows] for k in rows[0] if k.startswith("timing_s/")}}


def run_trl(case: Case, assets_dir: str, steps: int, threads: int) -> dict[str, Any]:
    if case.kind == "ppo":
        argv = [str(TRL112_PY), str(REPO / "benchmarks" / "trl_ppo_script.py"), "--assets", assets_dir,
                "--steps", str(steps), "--batch", str(case.prompts), "--response-length", str(case.response_length),
                "--mini-batches", str(case.mini_batches), "--epochs", str(case.epochs), "--threads", str(threads),
                "--lr", str(LR)]
    else:
        argv = [str(TRL116_PY), str(REPO / "benchmarks" / "trl_grpo_script.py"), "--assets", assets_dir,
                "--steps", str(steps), "--prompts", str(case.prompts), "--generations", str(case.n),
                "--response-length", str(case.response_length), "--threads", str(threads), "--lr", str(LR)]
    env = {"TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    m = run_measured(argv, env=env, cwd=str(REPO))
    if m.returncode != 0:
        raise RuntimeError(f"TRL failed (exit {m.returncode}):\n{tail(m.stderr)}")
    res = last_json_line(m.stdout)
    n = len(res["step_s"])
    return {"step_s": res["step_s"], "tokens": [float(res["response_tokens_per_step"])] * n,
            "peak_rss_gb": m.peak_rss_gb, "wall_s": m.wall_s}


def summarize(run: dict[str, Any]) -> tuple[float, float]:
    """(median seconds per step, response tokens/s) of one run, the warm-up step excluded."""
    steps = run["step_s"][1:] or run["step_s"]
    toks = run["tokens"][1:] or run["tokens"]
    s = statistics.median(steps)
    return s, statistics.median(toks) / s


def trl_python(case: Case) -> Path:
    return TRL112_PY if case.kind == "ppo" else TRL116_PY


def build_assets(root: Path, n_prompts: int) -> dict[str, str]:
    m = run_measured([main_python(), "-m", "benchmarks._assets", str(root), str(n_prompts)],
                     env={"PYTHONPATH": str(REPO)}, cwd=str(REPO))
    if m.returncode != 0:
        raise RuntimeError(f"building the benchmark model failed:\n{tail(m.stderr)}")
    return dict(last_json_line(m.stdout))


def bench(reps: int, steps: int, smoke: bool, skip_trl: bool, threads: int = 2,
          cases: tuple[str, ...] | None = None, on_case: Callable[[list[Row], dict[str, Any]], None] | None = None,
          ) -> tuple[list[Row], dict[str, Any]]:
    """All cases (or those named in ``cases``); ``on_case(rows, details)`` is called after each case, so a long
    run that is stopped keeps what it measured."""
    todo = [c for c in (SMOKE_CASES if smoke else FULL_CASES) if cases is None or c.name in cases]
    rows: list[Row] = []
    details: dict[str, Any] = {"cases": {}}
    with tempfile.TemporaryDirectory(prefix="bench_assets_") as tmp:
        assets = build_assets(Path(tmp), 64)
        for case in todo:
            trl_ok = not skip_trl and trl_python(case).exists()
            why = "" if trl_ok else ("TRL skipped (--skip-trl)" if skip_trl else
                                     f"TRL skipped: {trl_python(case).relative_to(REPO)} is missing (make bench-venvs)")
            labels = ["ours", "trl"] if trl_ok else ["ours"]
            runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
            for rep, side in interleave(reps, labels):
                log(f"{case.label}: rep {rep + 1}/{reps} {side}")
                if side == "ours":
                    runs[side].append(run_ours(case, assets, steps, threads))
                else:
                    runs[side].append(run_trl(case, str(Path(tmp)), steps, threads))
            ours = [summarize(r) for r in runs["ours"]]
            trl = [summarize(r) for r in runs["trl"]]
            g = f"trainer: {case.label}"
            note = why or "TRL " + ("1.12 trl.experimental.ppo.PPOTrainer" if case.kind == "ppo" else
                                    "1.16 GRPOTrainer")
            rows.append(make_row(f"{case.name}: response tokens/s", "tokens/s", [t for _, t in ours],
                                 [t for _, t in trl] or None, group=g, note=note))
            rows.append(make_row(f"{case.name}: seconds per step", "s", [s for s, _ in ours],
                                 [s for s, _ in trl] or None, higher_is_better=False, group=g, note=note))
            rows.append(make_row(f"{case.name}: peak RSS", "GB", [r["peak_rss_gb"] for r in runs["ours"]],
                                 [r["peak_rss_gb"] for r in runs["trl"]] or None, higher_is_better=False, group=g,
                                 note=note))
            details["cases"][case.name] = {"label": case.label, "runs": runs}
            if on_case is not None:
                on_case(rows, details)
    return rows, details
