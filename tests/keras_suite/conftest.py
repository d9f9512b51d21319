"""The plugin that runs Keras' own tests against elastic models.

For every test of this folder (but the suite's own checks, `META_FILES`):

- a fresh embedded cluster, as tests/conftest.py's `embedded_cluster` makes
  one: the KERAS_ELASTIC_* environment cleared but the job token and the
  index directory, `reset_cluster()` before and after the test;
- Keras' `compile`, `fit`, `evaluate` and `predict` patched (monkeypatch, on
  the class that defines each: `Trainer.compile`, `TensorFlowTrainer.fit`,
  ...; undone after the test): a `keras.Model` that is not elastic is
  `ke.wrap`ped and the call made again on it, i.e. to the method `ke.wrap`
  installed; an elastic model's call of the class's method (keras_elastic
  calls Keras' through `getattr(type(model), name)`) goes to Keras' own;
- counts, per test: the models wrapped, the trainers that are not a
  `keras.Model` (which `ke.wrap` refuses: they run with Keras alone), and
  each fit, evaluate and predict by the path it took (`PATHS`);
- the manifest (expected.py): a `NOT_APPLICABLE` test is skipped with its
  reason, a `DEFECTS` one runs as `xfail(strict=True)`; a test skipped or
  xfailed otherwise (an upstream `skipTest`, a skip marker) fails, naming the
  skip's reason: no test leaves the suite silently.

Environment:

- `KE_KERAS_SUITE_PLAIN=1`: Keras alone (nothing patched, the manifest not
  applied): which tests fail without keras-elastic.
- `KE_KERAS_SUITE_JOB=1`: every worker of a launched job runs the tests
  (run_in_job.py, as tests/test_keras_suite_job.py launches it): the job's
  cluster is kept from test to test (no embedded one), the tests of
  `expected.JOB_NOT_APPLICABLE` are skipped with their reason, and the
  record is written per worker (`RECORD.worker-<id>`).
- `KE_KERAS_SUITE_TIMEOUT=SECONDS` (120; 0: none): a test running longer
  fails (`SuiteTimeout`, every thread's stack on stderr), so a hang does not
  stop the run.
- `KE_KERAS_SUITE_RECORD=PATH`: each test's outcome, seconds, failure line
  and counts written to PATH as JSON, rewritten after each test (under
  pytest-xdist, `PATH.<worker id>` per worker); `python -m
  tests.keras_suite.report PATH` makes docs/keras_tests.md from it.

A model whose own `compile`/`fit`/... override reaches Keras' through
`super()` before it is elastic cannot be made elastic for that call (its
override is already running): it runs Keras' own, the model is wrapped
after, and `not_wrappable` names it (none of the suite's modules do this).
"""

from __future__ import annotations

import collections
import faulthandler
import functools
import json
import logging
import os
import signal
import sys
import threading

import keras
import pytest
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
from keras.src.trainers.trainer import Trainer

from . import expected

HERE = os.path.dirname(os.path.abspath(__file__))
# The suite's own checks: no cluster, no patch, no record.
META_FILES = frozenset({"test_upstream_diffs.py", "test_keras_tests_doc.py"})
# The copies of Keras' modules are imported by the test files, never collected.
collect_ignore_glob = ["upstream/*"]

PLAIN = os.environ.get("KE_KERAS_SUITE_PLAIN") == "1"
JOB = os.environ.get("KE_KERAS_SUITE_JOB") == "1"
RECORD = os.environ.get("KE_KERAS_SUITE_RECORD", "")
TIMEOUT = int(os.environ.get("KE_KERAS_SUITE_TIMEOUT", "120"))
TOKEN_ENV = "KERAS_ELASTIC_TOKEN"
KEPT_ENV = ("KERAS_ELASTIC_INDEX_DIR", TOKEN_ENV)
PATCHED = ("compile", "fit", "evaluate", "predict")
FALLBACK_WARNING = "training with Keras' own loop"
# What each counted call means.
PATHS = {
    "fit.elastic": "Keras' fit loop run by an elastic fit (the session's tasks)",
    "fit.keras_loop": "Keras' own fit outside an elastic fit (ke's fallback for "
                      "data it cannot hand out in tasks)",
    "evaluate.elastic": "an elastic evaluate (ElasticSession.evaluate_round)",
    "evaluate.keras_loop": "Keras' own evaluate outside an elastic fit",
    "validation.elastic": "an elastic validation round inside fit",
    "validation.keras_loop": "Keras' own evaluate inside an elastic fit "
                             "(validation data that is not arrays)",
    "predict.elastic": "an elastic predict (ElasticSession.predict)",
    "predict.local": "Keras' predict after ke's pull of the servers' values "
                     "(ke's predict on data other than an ElasticDataset)",
}

# Per test id (relative to this folder): counts, then the outcome.
_records: dict[str, dict] = {}


def suite_id(item) -> str | None:
    """`FILE::CLASS::METHOD` relative to this folder, or None for an item
    outside it or one of the suite's own checks."""
    path = str(item.path)
    if os.path.dirname(path) != HERE or os.path.basename(path) in META_FILES:
        return None
    return os.path.basename(path) + "::" + item.nodeid.split("::", 1)[1]


# -- the manifest -------------------------------------------------------------
def pytest_collection_modifyitems(config, items):
    """NOT_APPLICABLE tests skipped, DEFECTS run as strict xfails."""
    if PLAIN:
        return
    for item in items:
        name = suite_id(item)
        if name is None:
            continue
        not_applicable = expected.find(expected.NOT_APPLICABLE, name)
        if JOB and not not_applicable:
            job_only = expected.find(expected.JOB_NOT_APPLICABLE, name)
            if job_only:
                item.add_marker(pytest.mark.skip(
                    reason="not applicable in a job: "
                    + expected.JOB_NOT_APPLICABLE[job_only]))
                continue
        defect = expected.find(expected.DEFECTS, name)
        if JOB and defect is None and not not_applicable and expected.find(
                expected.JOB_DEFECTS, name):
            item.add_marker(pytest.mark.xfail(
                strict=True, reason="keras-elastic defect in a job: "
                + expected.JOB_DEFECTS[expected.find(expected.JOB_DEFECTS, name)]))
            continue
        if not_applicable and defect:
            raise pytest.UsageError(f"{name} is matched by NOT_APPLICABLE "
                                    f"{not_applicable!r} and DEFECTS {defect!r}")
        if not_applicable:
            item.add_marker(pytest.mark.skip(
                reason="not applicable: " + expected.NOT_APPLICABLE[not_applicable]))
        elif defect:
            item.add_marker(pytest.mark.xfail(
                strict=True, reason="keras-elastic defect: " + expected.DEFECTS[defect]))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A skip or xfail the manifest does not name fails the test."""
    report = yield
    name = suite_id(item)
    if name is None or PLAIN or not report.skipped:
        return report
    if hasattr(report, "wasxfail"):
        if expected.find(expected.DEFECTS, name) is None and not (
                JOB and expected.find(expected.JOB_DEFECTS, name)):
            report.outcome = "failed"
            report.longrepr = (f"xfailed ({report.wasxfail}) without a DEFECTS entry "
                               "in tests/keras_suite/expected.py")
    elif expected.find(expected.NOT_APPLICABLE, name) is None and not (
            JOB and expected.find(expected.JOB_NOT_APPLICABLE, name)):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        report.outcome = "failed"
        report.longrepr = (f"skipped ({reason}) without a NOT_APPLICABLE entry in "
                           "tests/keras_suite/expected.py")
    return report


# -- a hang fails its test ------------------------------------------------------
class SuiteTimeout(Exception):
    """A test ran past `TIMEOUT` seconds (every thread's stack went to stderr)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test of the suite running past `TIMEOUT` seconds raises `SuiteTimeout`
    in the main thread (SIGALRM, as pytest-timeout's signal method): a hang
    (an elastic fit waiting for an epoch that never ends) fails its test and
    the run goes on."""
    if (suite_id(item) is None or not TIMEOUT or not hasattr(signal, "SIGALRM")
            or threading.current_thread() is not threading.main_thread()):
        return (yield)

    def expire(signum, frame):
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        raise SuiteTimeout(f"the test ran past {TIMEOUT} s "
                           "(KE_KERAS_SUITE_TIMEOUT; stacks on stderr)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIMEOUT)
    try:
        return (yield)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- the cluster and the patch --------------------------------------------------
@pytest.fixture(autouse=True)
def elastic_keras(request, monkeypatch):
    """A fresh embedded cluster; every Keras model made elastic before it
    compiles, trains, evaluates or predicts (see the module doc). Yields the
    test's counts."""
    name = suite_id(request.node)
    if name is None:
        yield None
        return
    from keras_elastic.worker import cluster as cluster_module

    if not JOB:  # (a job's worker keeps the job's cluster)
        for key in list(os.environ):
            if key.startswith("KERAS_ELASTIC_") and key not in KEPT_ENV:
                monkeypatch.delenv(key)
        cluster_module.reset_cluster()
    counts = {"wrapped": 0, "not_wrappable": [], "calls": collections.Counter(),
              "fallback_warnings": 0}
    _records[name] = counts
    handler = None
    if not PLAIN:
        _patch_keras(monkeypatch, counts)
        handler = _FallbackCounter(counts)
        logging.getLogger("absl").addHandler(handler)
    try:
        yield counts
    finally:
        if handler is not None:
            logging.getLogger("absl").removeHandler(handler)
        if not JOB:
            cluster_module.reset_cluster()


class _FallbackCounter(logging.Handler):
    """Counts keras_elastic's warning that fit trains with Keras' own loop."""

    def __init__(self, counts: dict) -> None:
        super().__init__(logging.WARNING)
        self._counts = counts

    def emit(self, record: logging.LogRecord) -> None:
        if FALLBACK_WARNING in record.getMessage():
            self._counts["fallback_warnings"] += 1


def _defining_class(name: str) -> type:
    """The class whose own `name` a TensorFlow-backend keras.Model uses."""
    for cls in keras.Model.__mro__:
        if cls in (TensorFlowTrainer, Trainer) and name in cls.__dict__:
            return cls
    raise AssertionError(f"neither TensorFlowTrainer nor Trainer defines {name}")


def _patch_keras(monkeypatch, counts: dict) -> None:
    """Patches Keras' methods (`PATCHED`) and counts the elastic session's
    calls, for this test only."""
    import keras_elastic as ke
    from keras_elastic.model import is_elastic, is_trainer
    from keras_elastic.worker.session import ElasticSession, session_of

    calls = counts["calls"]

    def patched(name: str, original):
        def method(self, *args, **kwargs):
            if is_elastic(self):  # keras_elastic calling Keras' own method
                _count_keras_call(name, session_of(self), calls)
                return original(self, *args, **kwargs)
            if not is_trainer(self):  # what ke.wrap takes
                counts["not_wrappable"].append(type(self).__name__)
                return original(self, *args, **kwargs)
            if getattr(type(self), name) is not method:
                # Reached through super() from the model's own `name`, which
                # is already running: it cannot be made to run elastic now.
                counts["not_wrappable"].append(f"{type(self).__name__}.{name} "
                                               "(its own override)")
                result = original(self, *args, **kwargs)
                ke.wrap(self)
                counts["wrapped"] += 1
                return result
            ke.wrap(self)
            counts["wrapped"] += 1
            return getattr(self, name)(*args, **kwargs)  # the method ke installed

        return functools.wraps(original)(method)

    for name in PATCHED:
        cls = _defining_class(name)
        monkeypatch.setattr(cls, name, patched(name, cls.__dict__[name]))

    evaluate_round = ElasticSession.evaluate_round
    predict = ElasticSession.predict

    @functools.wraps(evaluate_round)
    def counted_evaluate_round(self, dataset, *args, **kwargs):
        after = kwargs.get("after", args[1] if len(args) > 1 else "")
        calls["validation.elastic" if after else "evaluate.elastic"] += 1
        return evaluate_round(self, dataset, *args, **kwargs)

    @functools.wraps(predict)
    def counted_predict(self, *args, **kwargs):
        calls["predict.elastic"] += 1
        return predict(self, *args, **kwargs)

    monkeypatch.setattr(ElasticSession, "evaluate_round", counted_evaluate_round)
    monkeypatch.setattr(ElasticSession, "predict", counted_predict)


def _count_keras_call(name: str, session, calls: collections.Counter) -> None:
    """Counts Keras' own `name` called on an elastic model by its path."""
    if name == "fit":
        calls["fit.elastic" if session.training else "fit.keras_loop"] += 1
    elif name == "evaluate":
        calls["validation.keras_loop" if session.training
              else "evaluate.keras_loop"] += 1
    elif name == "predict":
        calls["predict.local"] += 1


# -- the record -----------------------------------------------------------------
def pytest_runtest_logreport(report):
    """Keeps each test's outcome, seconds and failure line; the record is
    written after each test."""
    path, _, rest = report.nodeid.partition("::")
    if os.path.dirname(os.path.join(str(_config.rootpath), path)) != HERE or \
            os.path.basename(path) in META_FILES:
        return
    record = _records.setdefault(os.path.basename(path) + "::" + rest, {})
    record["seconds"] = record.get("seconds", 0.0) + report.duration
    outcome = _outcome(report)
    previous = record.get("outcome")
    # The first failure of a test is its outcome (not a teardown error after it).
    if outcome is not None and previous in (None, "passed"):
        record["outcome"] = outcome
        if outcome != "passed":
            record["message"] = _first_line(report)
    if report.when == "teardown":
        _write_record()


def _first_line(report) -> str:
    """The exception line of a failure, or the reason of a skip or xfail."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    elif isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    else:
        text = str(report.longrepr or "")
    if hasattr(report, "wasxfail") and crash is None:
        text = report.wasxfail
    return (text.strip().splitlines() or [""])[0][:300]


def _outcome(report) -> str | None:
    """The test's outcome this phase shows, or None (a setup or teardown
    that passed)."""
    if report.failed:
        if "XPASS(strict)" in str(report.longrepr):
            return "xpassed"
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    return "passed" if report.when == "call" else None


_config = None


def pytest_configure(config):
    global _config
    _config = config


def _write_record() -> None:
    """The record so far (after each test: a run killed midway keeps it)."""
    worker = getattr(_config, "workerinput", {}).get("workerid")
    if not RECORD or not _records or (
            worker is None and getattr(_config.option, "numprocesses", None)):
        return  # (pytest-xdist's controller: its workers write theirs)
    path = RECORD if worker is None else f"{RECORD}.{worker}"
    if JOB:
        path = f"{RECORD}.worker-{os.environ.get('KERAS_ELASTIC_WORKER_ID', '?')}"
    tests = {}
    for name, record in sorted(_records.items()):
        record = dict(record)
        if "calls" in record:
            record["calls"] = dict(sorted(record["calls"].items()))
        tests[name] = record
    with open(path, "w") as f:
        json.dump({"mode": "plain" if PLAIN else "elastic",
                   "keras": keras.__version__, "tests": tests}, f, indent=1,
                  sort_keys=True)
