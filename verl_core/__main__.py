"""``python -m verl_core``: :func:`verl_core.cli.main`, then a quick exit.

A process that has imported torch and transformers spends about a second after its last line tearing down
modules and collecting their objects (measured on 2 CPU cores), which is part of a short trial's cost. Once ``main``
returns, the exit does what the interpreter's own shutdown does that anyone can observe: it joins the threads that
are not daemons, runs the ``atexit`` handlers (logging's flush, trackers' finish, multiprocessing's clean-up),
flushes stdout and stderr, then ends the process with ``os._exit``, skipping the teardown. An exception out of
``main`` (exit 1 with its traceback) takes the ordinary path.
"""

import atexit
import os
import sys
import threading

from verl_core.cli import main


def quick_exit(code: int) -> None:
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to write to
            pass
    os._exit(code)


quick_exit(main())
