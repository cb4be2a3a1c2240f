"""The ``verl-hpo`` subcommands, one module each (``_search``, ``_resume``, ``_worker``, ``_confirm``, ``_validate``,
``_rehearse``, ``_dashboard``, ``_track``, ``_best``): its flags (``add_arguments``) and what it runs (``run``, the
exit code); here, each one's :class:`Subcommand` (its name, its help, its module), the rows of :mod:`hpo._cli`'s
dispatch table, which imports a subcommand's module only when that subcommand runs. What they share: ``_base``
(:class:`Invocation`, the ``error:`` line, the command line that goes on with a study), ``_args`` (flag groups),
``_study`` (a study run under the stop signals, :class:`~hpo.commands._study.StudyRun`, which search, resume, worker
and confirm each build from their flags), ``_speed_from`` (``study.speed_from``'s settings, looked up and re-asked).

May import: everything in ``hpo`` (``tracking`` and below); never ``hpo._cli``."""

from hpo.commands._base import (
    EXIT_SIGNAL,
    Invocation,
    Subcommand,
    check_numbers,
    check_studies_dir,
    default_studies_dir,
    fail,
    follow_up,
    make_studies_dir,
)

# The subcommands, each with its help and its module (imported when the subcommand is parsed: see Subcommand).
SEARCH = Subcommand("search", "run (or continue) a study of an experiment file", "_search")
RESUME = Subcommand("resume", "continue a study until it has n_trials finished trials", "_resume")
WORKER = Subcommand("worker", "join an existing study (its stored experiment) and run trials until the study's target "
                              "is reached; run one per host or GPU box", "_worker")
CONFIRM = Subcommand("confirm", "re-run the top trials with fresh seeds (as tagged trials of the study); best then "
                                "ranks by the confirmed mean", "_confirm")
VALIDATE = Subcommand("validate", "check an experiment file without running it: the space, every corner against the "
                                  "trainer config, and each corner's memory estimate", "_validate")
REHEARSE = Subcommand("rehearse", "an experiment of a trainer that has a rehearsal: run its own pipeline (config, "
                                  "data, reward, objective, corners, a resume) shrunk to a small model on this CPU, "
                                  "and report what would fail a real study; exit 0 it would run, 1 it would fail, 3 a "
                                  "corner could not finish on this machine (not a failure)", "_rehearse")
DASHBOARD = Subcommand("dashboard", "write <studies-dir>/<study>/dashboard.html (one self-contained page)",
                       "_dashboard")
TRACK = Subcommand("track", "log to MLflow / W&B what this host's drivers of a study could not (a tracking server that "
                            "was down past tracking.flush_s)", "_track")
BEST = Subcommand("best", "print the best trial as trainer overrides (pareto studies: the front); after confirm, the "
                          "best confirmed mean", "_best")

__all__ = ["BEST", "CONFIRM", "DASHBOARD", "EXIT_SIGNAL", "REHEARSE", "RESUME", "SEARCH", "TRACK", "VALIDATE",
           "WORKER", "Subcommand", "Invocation", "check_numbers", "check_studies_dir", "default_studies_dir", "fail",
           "follow_up", "make_studies_dir"]
