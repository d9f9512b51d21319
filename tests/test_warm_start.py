"""Warm role processes (keras_elastic/launcher/warm/): a role forked from a
process that imported TensorFlow once sees what it would see started afresh.

Real processes throughout: the local backend's `ManagedProcess` started
afresh and from a real warm process (`LocalBackend.prepare`), the same probe
script in both (tests/scripts/warm_probe.py), compared field by field.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, subprocess_env

from keras_elastic.launcher.backends import LocalBackend
from keras_elastic.launcher.warm import command as commands
from keras_elastic.launcher.warm import pool as warm_pool

PROBE = os.path.join(REPO, "tests", "scripts", "warm_probe.py")

pytestmark = pytest.mark.multiprocess


# -- which commands run warm (pure) ------------------------------------------
def test_a_command_runs_warm_only_as_the_same_interpreter_with_the_same_start():
    env = {"PATH": os.path.dirname(sys.executable), "PYTHONPATH": "a"}
    python = sys.executable
    assert commands.plan([python, "t.py", "x"], env, env, python) == \
        commands.WarmCommand("script", "t.py", ["t.py", "x"])
    assert commands.plan([python, "-m", "pkg.mod", "x"], env, env, python) == \
        commands.WarmCommand("module", "pkg.mod", ["pkg.mod", "x"])
    assert commands.plan([python, "-c", "print(1)", "x"], env, env, python) == \
        commands.WarmCommand("code", "print(1)", ["-c", "x"])
    # By name on the PATH, as the user's `python train.py`.
    assert commands.plan([os.path.basename(python), "t.py"], env, env, python) \
        is not None
    refusals = {
        "-u": commands.why_not([python, "-u", "t.py"], env, env, python),
        "other": commands.why_not(["/bin/sh", "t.py"], env, env, python),
        "-m alone": commands.why_not([python, "-m"], env, env, python),
        "pythonpath": commands.why_not([python, "t.py"], dict(env, PYTHONPATH="b"),
                                       env, python),
        "keras backend": commands.why_not([python, "t.py"],
                                          dict(env, KERAS_BACKEND="jax"), env, python),
    }
    assert "-u is fixed at start" in refusals["-u"]
    assert "is not the interpreter" in refusals["other"]
    assert "-m without its argument" in refusals["-m alone"]
    assert "PYTHONPATH differs" in refusals["pythonpath"]
    assert "KERAS_BACKEND differs" in refusals["keras backend"]
    # The job's own variables and the runtime's may differ.
    assert commands.why_not([python, "t.py"], dict(
        env, KERAS_ELASTIC_WORKER_ID="3", CUDA_VISIBLE_DEVICES="1",
        OMP_NUM_THREADS="2"), env, python) is None


# -- a role started warm sees what it would see afresh -----------------------
@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """A fresh and a warm local backend. The warm process gets ready only if
    importing what it imports started no TensorFlow runtime (the fork is
    safe only before one exists: zygote.main refuses to serve otherwise)."""
    job = tmp_path_factory.mktemp("warm")
    warm = LocalBackend(warm=True)
    # As a launcher started with the suite's environment would (prepare()).
    warm.pool = warm_pool.WarmPool(str(job / "warm.log"), subprocess_env())
    assert warm.pool.usable(), open(warm.pool.log_path).read()
    process = warm.pool.process
    yield LocalBackend(warm=False), warm, job
    warm.shutdown()
    assert process.poll() is not None  # the warm process ends with its backend


def _start(backend, job, name, args, env=None, cwd=None):
    env = dict(subprocess_env(), PROBE="here", **(env or {}))
    env.pop("GONE", None)
    old = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        return backend.start(name, [sys.executable, PROBE, *args],
                             str(job / f"{name}.log"), env, kind="worker", echo=False)
    finally:
        os.chdir(old)


def _probe(handle, timeout=60):
    code = handle.popen.wait(timeout)
    handle.close()
    with open(handle.log_path) as f:
        text = f.read()
    line = next(line for line in text.splitlines() if line.startswith("{"))
    return code, json.loads(line), text


@pytest.mark.parametrize("args, code", [(["3"], 3), ([], 0), (["raise"], 1)])
def test_a_warm_role_sees_what_a_fresh_one_sees(backends, tmp_path, args, code):
    fresh_backend, warm_backend, job = backends
    os.environ["GONE"] = "in the launcher, not given to the role"
    try:
        starts = {kind: _start(backend, job, f"{kind}-{'-'.join(args)}", args,
                               cwd=str(tmp_path))
                  for kind, backend in (("fresh", fresh_backend),
                                        ("warm", warm_backend))}
    finally:
        del os.environ["GONE"]
    assert starts["warm"].warm and not starts["fresh"].warm
    seen = {kind: _probe(handle) for kind, handle in starts.items()}
    (fresh_code, fresh, fresh_log), (warm_code, warm, warm_log) = \
        seen["fresh"], seen["warm"]
    assert warm_code == fresh_code == code
    random = (fresh.pop("random"), warm.pop("random"))
    assert warm == fresh
    assert warm["argv"] == [PROBE, *args] and warm["name"] == "__main__"
    assert warm["cwd"] == str(tmp_path) and warm["path0"] == os.path.dirname(PROBE)
    assert warm["probe"] == "here" and warm["gone"] is None and warm["stdin"] == ""
    # Python's handler for SIGINT, unless the launcher's own parent ignored
    # it (a shell's background job: a fresh role inherits that too).
    assert warm["sigint"] == (signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    assert warm["session_leader"] and warm["sigterm"]
    assert warm["sigchld"] and warm["sigpipe_ignored"]
    assert random[0] != random[1]  # each from the machine's entropy
    if args == ["raise"]:
        # The same traceback: the script's frames only.
        def traceback(log):
            return log[log.index("Traceback"):].strip()

        assert traceback(warm_log) == traceback(fresh_log)
        assert "keras_elastic" not in traceback(warm_log)


def test_signals_end_a_warm_role_as_a_fresh_one(backends):
    fresh_backend, warm_backend, job = backends
    for args, expected in ((["sleep"], -signal.SIGTERM), (["term-handler"], 7)):
        for backend in (fresh_backend, warm_backend):
            handle = _start(backend, job, f"sig-{args[0]}-{backend.warm}", args)
            deadline = time.monotonic() + 60
            while "sleeping" not in handle.tail() and time.monotonic() < deadline:
                time.sleep(0.05)
            handle.terminate(timeout=20)
            assert handle.popen.poll() == expected, (args, backend.warm, handle.tail())
    handle = _start(warm_backend, job, "killed", ["sleep"])
    handle.kill()
    assert handle.popen.poll() == -signal.SIGKILL


def test_the_jobs_seed_reaches_a_warm_role_as_a_fresh_one(backends, tmp_path):
    fresh_backend, warm_backend, job = backends
    env = {"KERAS_ELASTIC_SEED": "1234", "KERAS_ELASTIC_LAUNCHER_PID": str(os.getpid())}
    draws = []
    for backend in (fresh_backend, warm_backend):
        handle = backend.start(
            f"seeded-{backend.warm}",
            [sys.executable, "-c", "import keras_elastic, numpy as np, random; "
             "print(np.random.random(), random.random())"],
            str(job / f"seeded-{backend.warm}.log"),
            dict(subprocess_env(), **env), kind="worker", echo=False)
        assert handle.popen.wait(60) == 0, handle.tail()
        handle.close()
        draws.append(handle.tail(1))
    assert draws[0] == draws[1] and draws[0].strip()


def test_a_command_the_warm_process_cannot_run_starts_afresh(backends):
    _, warm_backend, job = backends
    unbuffered = warm_backend.start(
        "unbuffered", [sys.executable, "-u", PROBE, "5"], str(job / "unbuffered.log"),
        dict(subprocess_env(), PROBE="x"), kind="worker", echo=False)
    other_path = _start(warm_backend, job, "other-path", ["5"],
                        env={"PYTHONPATH": subprocess_env()["PYTHONPATH"] + ":x"})
    for handle in (unbuffered, other_path):
        assert not handle.warm
        assert _probe(handle)[0] == 5


def test_two_warm_roles_draw_their_own_random_numbers(backends):
    """A fresh process seeds NumPy's global generator from the machine's
    entropy; a fork would share the warm process' state unless reseeded."""
    _, warm_backend, job = backends
    draws = [_probe(_start(warm_backend, job, f"draw-{i}", []))[1]["random"]
             for i in range(2)]
    assert draws[0] != draws[1]


@pytest.mark.parametrize("flag", ["--warm_start", "--nowarm_start"])
def test_a_jobs_worker_is_forked_warm_unless_nowarm_start(tmp_path, flag):
    """A job's worker runs the user's command in a process that already
    imported TensorFlow (forked warm), or, with `--nowarm_start`, in a fresh
    interpreter that has not: what a script sees at its first line."""
    from conftest import wait_for

    shared = os.environ.get("KERAS_ELASTIC_WARM_SOCKET", "")
    if shared:  # the suite's shared warm process serves once it imported
        wait_for(lambda: os.path.exists(shared), timeout=120,
                 what="the shared warm process")
    probe = ("import sys; print('tensorflow imported before the script:', "
             "'tensorflow' in sys.modules)")
    argv = [sys.executable, "-m", "keras_elastic", "run", f"--job_dir={tmp_path}/job",
            "--num_workers=1", flag, "--", sys.executable, "-c", probe]
    result = subprocess.run(argv, env=subprocess_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    warm = flag == "--warm_start" and warm_pool.enabled()
    assert f"tensorflow imported before the script: {warm}" in result.stdout
    # The suite's shared warm process (conftest.shared_warm_process), once
    # it serves, else one of the job's own.
    launcher_log = result.stdout + result.stderr
    assert ("warm starts" in launcher_log) == warm
    if warm and shared:
        assert f"(shared, at {shared})" in launcher_log, launcher_log


# -- the role's environment: one contract -------------------------------------
def test_every_variable_the_library_reads_is_in_the_roles_contract():
    """common/role_env.VARIABLES names every KERAS_ELASTIC_* variable the
    library reads: the contract between the launcher and a role process."""
    import re

    from keras_elastic.common.role_env import VARIABLES

    found = set()
    package = os.path.join(REPO, "keras_elastic")
    for root, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name)) as f:
                    found |= set(re.findall(r"\"(KERAS_ELASTIC_[A-Z_]*[A-Z])\"", f.read()))
    assert found and not found - set(VARIABLES), sorted(found - set(VARIABLES))


def test_importing_what_a_warm_process_imports_keeps_no_variable_of_the_role():
    """A warm process imports before it knows its role: no module may keep a
    role's variable read at import (it would be the warm process' value).
    Every variable but those `enter_job` reads is set to a marker; after the
    imports, no module global of keras_elastic holds one."""
    from keras_elastic.common.role_env import VARIABLES

    entered = ("KERAS_ELASTIC_LAUNCHER_PID", "KERAS_ELASTIC_SEED",
               "KERAS_ELASTIC_WARM_START", "KERAS_ELASTIC_REPLACES")
    env = dict(subprocess_env(), **{name: f"marker-{name}" for name in VARIABLES
                                    if name not in entered})
    code = """
import importlib, sys
from keras_elastic.launcher.warm.zygote import PRELOAD, runtime_started
for module in PRELOAD:
    importlib.import_module(module)
assert not runtime_started()
def holds(value, depth=0):
    if isinstance(value, str):
        return "marker-" in value
    if depth < 2 and isinstance(value, (tuple, list, set, frozenset)):
        return any(holds(v, depth + 1) for v in value)
    if depth < 2 and isinstance(value, dict):
        return any(holds(v, depth + 1) for v in value.values())
    return False
kept = sorted(f"{name}.{key}" for name, module in list(sys.modules.items())
              if name.startswith("keras_elastic")
              for key, value in list(vars(module).items()) if holds(value))
print("kept:", kept)
"""
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kept: []" in result.stdout, result.stdout


def test_a_shared_warm_process_refuses_a_socket_path_too_long_to_bind(tmp_path):
    """A Unix socket's path has at most 107 bytes (a deep pytest directory
    passed it: the warm process died at bind and every job started its own):
    said at once, before the imports, with the path."""
    path = str(tmp_path / ("x" * 120) / "warm.sock")
    result = subprocess.run([sys.executable, "-m", "keras_elastic.launcher.warm",
                             f"--listen={path}"], env=subprocess_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"--listen={path}: a Unix socket's path has at most 107 bytes" in (
        result.stderr), result.stderr
