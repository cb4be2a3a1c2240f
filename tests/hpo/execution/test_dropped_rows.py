"""The rows a trainer drops are counted in its trial (issue 52, item 1): verl 0.9.1's agent loop catches a prompt's
exception (a reward that raises on a row) and goes on without the prompt, saying so only in its log. The trial's log
pump counts verl's own lines (``VerlBackend.dropped_row_patterns``) in the whole output stream, before the log cap
cuts any, and keeps the first one's exception. A stand-in prints verl's lines exactly as verl and Ray do."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from hpo.backends.verl._backend import VerlBackend
from hpo.execution import TrialProcess, TrialRun
from tests.hpo.conftest import PY

# What a verl 0.9.1 run on the CPU prints when a user's reward does int(ground_truth) on rows whose ground truth is
# "NA": trainer/ppo/v1/agent_loop_tq.py's _run_prompt logs each failed session of the prompt (rollout.n of them) with
# logger.error(f"Error in _run_prompt for uid={uid}", exc_info=...) in verl's logging format
# ("%(levelname)s:%(asctime)s:%(message)s", verl/utils/logging_utils.py), in an AgentLoopWorkerTQ actor: Ray prints each
# line of the actor's stderr on the trainer's with the actor's prefix, and folds a line repeated by other actors into
# "<line> [repeated Nx across cluster]" (ray/_private/ray_logging/__init__.py, coloured).
VERL_ROWS = textwrap.dedent('''
    import io, logging, uuid


    def reward(ground_truth):  # the user's reward
        return 1.0 if int(ground_truth) == 57 else 0.0


    def dropped(prompts, sessions, pid):
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        handler.setFormatter(logging.Formatter("%(levelname)s:%(asctime)s:%(message)s"))
        logger = logging.getLogger("verl.trainer.ppo.v1.agent_loop_tq")
        logger.handlers, logger.propagate = [handler], False
        for _ in range(prompts):
            uid = str(uuid.uuid4())
            for _ in range(sessions):
                try:
                    reward("NA")
                except ValueError as error:
                    logger.error(f"Error in _run_prompt for uid={uid}",
                                 exc_info=(type(error), error, error.__traceback__))
        return "".join(f"(AgentLoopWorkerTQ pid={pid}) {line}\\n" for line in buf.getvalue().splitlines())


    def repeated(times, pid):
        return (f"(AgentLoopWorkerTQ pid={pid}) ERROR:2026-01-01 10:00:00,000:Error in _run_prompt for "
                f"uid={uuid.uuid4()}\\x1b[32m [repeated {times}x across cluster]\\x1b[0m\\n")
''')

TRAINER = VERL_ROWS + textwrap.dedent('''
    import json, sys
    prompts, sessions, chatter_mb, metrics = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    err = sys.stderr
    chatter = "(TaskRunner pid=11) step log line " + "." * 65 + "\\n"  # 100 bytes
    err.write(chatter * (chatter_mb * 10000))
    err.write(dropped(prompts, sessions, 4242))
    err.write(repeated(3, 4243))
    err.write(chatter * (chatter_mb * 10000))
    err.flush()
    with open(metrics, "w") as f:
        f.write(json.dumps({"step": 1, "data": {"val-core/openai/gsm8k/acc/mean@1": 0.5}}) + "\\n")
''')


def test_verl_s_dropped_prompts_are_counted_in_the_whole_stream_before_the_cap_cuts_them(tmp_path: Path) -> None:
    """5 prompts of 2 sessions each (10 lines, 5 uids) and a Ray summary of 3 more: 8 prompts lost, counted though
    the cap (1 MiB, 1 MB of output on each side) cut every one of those lines out of stderr.log."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    metrics = tmp_path / "trial" / "metrics.jsonl"
    result = TrialProcess(TrialRun([PY, str(script), "5", "2", "1", str(metrics)], dict(os.environ),
                                   tmp_path / "trial", metrics, log_cap=1 << 20,
                                   dropped_row_patterns=VerlBackend.dropped_row_patterns)).run()
    assert result.exit_code == 0 and result.failure is None and result.last_step == 1
    assert result.dropped_rows == 8
    assert result.dropped_rows_error is not None
    assert result.dropped_rows_error.startswith("ValueError: invalid literal for int() with base 10: 'NA' (after: ")
    assert "Error in _run_prompt for uid=" in result.dropped_rows_error
    log = (tmp_path / "trial" / "stderr.log").read_text()
    assert "Error in _run_prompt" not in log and "cut here" in log  # cut from the file, still counted
    assert result.dropped_error(8) is None
    why = result.dropped_error(7)
    assert why is not None and why.startswith("the trainer dropped 8 rows of its data (more than 7, "
                                              "$VERL_HPO_MAX_DROPPED_ROWS): ValueError: invalid literal")
    assert "the trainer dropped 8 row(s) of its data and went on without them" in "\n".join(result.log_lines())


def test_a_trainer_that_names_no_patterns_counts_nothing(tmp_path: Path) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    metrics = tmp_path / "trial" / "metrics.jsonl"
    result = TrialProcess(TrialRun([PY, str(script), "5", "2", "0", str(metrics)], dict(os.environ),
                                   tmp_path / "trial", metrics)).run()
    assert result.exit_code == 0 and result.dropped_rows == 0 and result.dropped_rows_error is None
    assert "Error in _run_prompt for uid=" in (tmp_path / "trial" / "stderr.log").read_text()  # under the cap: all


def test_a_reward_raised_in_ray_s_reward_worker_gives_the_reward_s_own_exception() -> None:
    """A real verl 0.9.1 log (``data/verl_reward_raised.log``, from a CPU trial whose reward raised on two validation
    rows): the reward runs in a Ray actor of its own, so the traceback after `Error in _run_prompt` holds Ray's
    ``RayTaskError(ValueError): ray::RewardLoopWorker.compute_score() ...`` and then the task's frames; the exception
    kept is the reward's, as the user wrote it."""
    from hpo.execution._logpump import RowCounter

    counter = RowCounter(VerlBackend.dropped_row_patterns)
    for line in (Path(__file__).with_name("data") / "verl_reward_raised.log").read_bytes().splitlines(keepends=True):
        counter.scan(line.rstrip(b"\n"), 2)
    assert counter.count == 2  # two prompts (two uids)
    assert counter.exception() == "ValueError: no scorer on this worker for row 0"
