"""Which commands a warm process can run, and how (pure: no process here).

A warm process (`launcher/warm/`) is a Python interpreter that has already
imported TensorFlow and Keras; it can become `python SCRIPT ARGS...`,
`python -m MODULE ARGS...` or `python -c CODE ARGS...` when the command's
`python` is that interpreter (the same virtual environment) and nothing the
interpreter fixed at its start differs: its flags (`-u`, `-X`, `-O`...) and
the environment variables read before or while TensorFlow and Keras are
imported (`IMPORT_TIME_ENV`). Any other command starts afresh.

Example:

>>> import sys
>>> env = {"PATH": "/usr/bin"}
>>> plan([sys.executable, "train.py", "--epochs", "3"], env, env, sys.executable)
WarmCommand(kind='script', target='train.py', argv=['train.py', '--epochs', '3'])
>>> why_not([sys.executable, "-u", "train.py"], env, env, sys.executable)
'the interpreter flag -u is fixed at start'
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence

# Read when the interpreter starts or while TensorFlow and Keras are
# imported: a warm process took them from its own environment, so a command
# whose environment says otherwise starts afresh. (CUDA_VISIBLE_DEVICES and
# the thread-count variables are read when TensorFlow's runtime starts, at
# the first operation: they may differ.)
IMPORT_TIME_ENV = ("HOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "TF_CPP_MIN_LOG_LEVEL",
                   "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TF_ENABLE_ONEDNN_OPTS",
                   "TF_USE_LEGACY_KERAS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                   "OPENBLAS_NUM_THREADS", "MALLOC_ARENA_MAX")
IMPORT_TIME_PREFIXES = ("PYTHON", "KERAS_")
# Prefixes of IMPORT_TIME_PREFIXES that are not import-time: the job's own.
JOB_PREFIX = "KERAS_ELASTIC_"


@dataclasses.dataclass(frozen=True)
class WarmCommand:
    """What a warm process runs: `kind` "script" (a file), "module" (`-m`)
    or "code" (`-c`), its `target`, and `sys.argv` as Python would set it."""

    kind: str
    target: str
    argv: list[str]


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that a warm process fixed at its start.

    >>> import_time_env({"PYTHONPATH": "src", "KERAS_ELASTIC_SEED": "3", "X": "1"})
    {'PYTHONPATH': 'src'}
    """
    return {k: v for k, v in env.items()
            if (k in IMPORT_TIME_ENV or k.startswith(IMPORT_TIME_PREFIXES))
            and not k.startswith(JOB_PREFIX)}


def _same_interpreter(program: str, env: Mapping[str, str], python: str) -> bool:
    """Whether `program` (a command's argv[0], looked up on env's PATH) is
    the interpreter `python`: the same file in the same directory (a virtual
    environment is its directory, not the binary its link points to)."""
    found = shutil.which(program, path=env.get("PATH")) if os.sep not in program \
        else program
    if not found:
        return False
    return same_interpreter(found, python)


def same_interpreter(a: str, b: str) -> bool:
    """Whether interpreter paths `a` and `b` are one: the same file in the
    same directory (`python` and `python3` of one virtual environment).

    >>> import sys
    >>> same_interpreter(sys.executable, sys.executable)
    True
    """
    a, b = os.path.abspath(a), os.path.abspath(b)
    return os.path.dirname(a) == os.path.dirname(b) and (
        os.path.realpath(a) == os.path.realpath(b))


def why_not(argv: Sequence[str], env: Mapping[str, str], warm_env: Mapping[str, str],
            python: str) -> str | None:
    """Why `argv` with environment `env` cannot run in a warm process started
    as `python` with environment `warm_env`; None when it can."""
    if len(argv) < 2:
        return "the command is not `python SCRIPT|-m MODULE|-c CODE ...`"
    if not _same_interpreter(argv[0], env, python):
        return f"{argv[0]!r} is not the interpreter the warm process runs ({python})"
    first = argv[1]
    if first.startswith("-") and first not in ("-m", "-c"):
        return f"the interpreter flag {first} is fixed at start"
    if first in ("-m", "-c") and len(argv) < 3:
        return f"{first} without its argument"
    ours, theirs = import_time_env(warm_env), import_time_env(env)
    for name in sorted(set(ours) | set(theirs)):
        if ours.get(name) != theirs.get(name):
            return (f"{name} differs from the warm process' ({theirs.get(name)!r} "
                    f"against {ours.get(name)!r}): it is read at start")
    return None


def plan(argv: Sequence[str], env: Mapping[str, str], warm_env: Mapping[str, str],
         python: str) -> WarmCommand | None:
    """The WarmCommand of `argv`, or None when it must start afresh
    (`why_not` says why)."""
    if why_not(argv, env, warm_env, python) is not None:
        return None
    return command_of(argv)


def command_of(argv: Sequence[str]) -> WarmCommand:
    """The WarmCommand of `argv`, which `why_not` accepted."""
    if argv[1] == "-m":
        return WarmCommand("module", argv[2], [argv[2], *argv[3:]])
    if argv[1] == "-c":
        return WarmCommand("code", argv[2], ["-c", *argv[3:]])
    return WarmCommand("script", argv[1], list(argv[1:]))
