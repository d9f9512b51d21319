"""In a forked warm process: become the role, as `python ...` would start it.

The zygote (`zygote.py`) forks; the child calls `become(request)` and then
runs the command exactly as a fresh interpreter would: a new session, the
role's output on stdout and stderr, stdin on /dev/null, the working
directory, the environment (every variable: replaced, not merged),
`sys.argv`, `sys.path[0]`, a fresh `__main__` module, the signal handlers
the launcher's children get (the zygote's own SIGCHLD handler and wakeup fd
are undone right after the fork: zygote.py), random generators reseeded
from the machine's entropy, and the job entered
(`keras_elastic.common.role_env.enter_job`). An exception the script does
not catch is printed without the warm process' frames and exits with 1;
`sys.exit(n)`, a signal and `os._exit` end it as they end any process.
Tested by tests/test_warm_start.py against a fresh process.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from importlib.machinery import SourceFileLoader

from keras_elastic.common.launcher_tie import set_parent_death_signal
from keras_elastic.launcher.warm.command import WarmCommand

_HERE = os.path.dirname(os.path.abspath(__file__))
_RUNPY = os.path.abspath(runpy.__file__)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the zygote dies (it dies with the launcher)."""
    set_parent_death_signal()
    if os.getppid() != parent:  # it died before the signal was set
        os._exit(137)


def _redirect(output_fd: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(output_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def _reseed() -> None:
    """A fresh interpreter seeds its generators from the machine's entropy;
    a forked one would share the zygote's state (Python's own `random`
    reseeds itself after a fork; NumPy's global generator does not)."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _strip_warm_frames(hook):
    """sys.excepthook without the frames of the warm machinery above the
    script's own (a fresh `python train.py` shows none)."""

    def excepthook(kind, value, tb):
        while tb is not None and (
                os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_HERE)
                or os.path.abspath(tb.tb_frame.f_code.co_filename) == _RUNPY
                or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
            tb = tb.tb_next
        if isinstance(value, BaseException):
            value = value.with_traceback(tb)  # the hook prints the exception's
        hook(kind, value, tb)

    return excepthook


def become(command: WarmCommand, env: dict[str, str], cwd: str, output_fd: int,
           parent: int) -> None:
    """Turns this forked process into the role: see the module doc. Returns
    once it is that process; `run(command)` then runs the command."""
    os.setsid()
    _die_with_parent(parent)
    _redirect(output_fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _reseed()
    sys.excepthook = _strip_warm_frames(sys.__excepthook__)
    from keras_elastic.common import role_env

    role_env.enter_job()


def run(command: WarmCommand) -> None:
    """Runs the command in this process as `python` would (returns when the
    command returns; SystemExit and exceptions propagate to the interpreter,
    which exits as it does after any script)."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if command.kind == "module":
        sys.argv = ["-m", *command.argv[1:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(command.target, alter_argv=True)
        return
    if command.kind == "code":
        sys.argv = list(command.argv)
        sys.path[0] = ""
        main.__dict__.update(__file__=None, __cached__=None, __spec__=None,
                             __loader__=None, __package__=None)
        del main.__dict__["__file__"], main.__dict__["__cached__"]
        exec(compile(command.target, "<string>", "exec"), main.__dict__)
        return
    script = os.path.abspath(command.target)  # as __main__.__file__ is since 3.9
    sys.argv = list(command.argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    with open(script, "rb") as f:
        source = f.read()
    main.__dict__.update(__file__=script, __cached__=None, __spec__=None,
                         __loader__=SourceFileLoader("__main__", script),
                         __package__=None)
    exec(compile(source, script, "exec"), main.__dict__)
