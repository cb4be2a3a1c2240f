"""The ``verl-hpo`` subcommands, one module each (``_search``, ``_resume``, ``_worker``, ``_confirm``, ``_validate``,
``_rehearse``, ``_dashboard``, ``_track``, ``_best``): its flags (``add_arguments``) and what it runs (``run``, the
exit code), as one :class:`Subcommand`, the row :mod:`hpo._cli`'s dispatch table holds. What they share: ``_base``
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
from hpo.commands._best import BEST
from hpo.commands._confirm import CONFIRM
from hpo.commands._dashboard import DASHBOARD
from hpo.commands._rehearse import REHEARSE
from hpo.commands._resume import RESUME
from hpo.commands._search import SEARCH
from hpo.commands._track import TRACK
from hpo.commands._validate import VALIDATE
from hpo.commands._worker import WORKER

__all__ = ["BEST", "CONFIRM", "DASHBOARD", "EXIT_SIGNAL", "REHEARSE", "RESUME", "SEARCH", "TRACK", "VALIDATE",
           "WORKER", "Subcommand", "Invocation", "check_numbers", "check_studies_dir", "default_studies_dir", "fail",
           "follow_up", "make_studies_dir"]
