"""More error paths, each with the message a user sees."""

import numpy as np
import pytest

from keras_elastic.common import cluster_env
from keras_elastic.common.tensor_codec import ChunkAssembler, encode
from keras_elastic.data import ArraySource
from keras_elastic.jobs.model_def import ModelDefError, check_model_def
from keras_elastic.launcher.processes import ProcessStartError, start_service
from keras_elastic.prediction import read_predictions


def test_array_source_needs_a_record_axis():
    with pytest.raises(ValueError, match="every array needs a leading \\(record\\) axis"):
        ArraySource((np.float32(1.0), np.zeros(3)))


def test_stream_must_start_at_offset_zero():
    chunks = list(encode("w", np.zeros(100, np.float32), chunk_bytes=100))
    with pytest.raises(ValueError, match="tensor 'w': first chunk has offset 100"):
        ChunkAssembler().add(chunks[1])


def test_read_predictions_without_parts(tmp_path):
    with pytest.raises(FileNotFoundError, match="no prediction parts"):
        read_predictions(str(tmp_path))


def test_cluster_environment_errors(monkeypatch):
    monkeypatch.setenv(cluster_env.MASTER, "127.0.0.1:1")
    monkeypatch.setenv(cluster_env.PS, "127.0.0.1:2")
    monkeypatch.setenv(cluster_env.WORKER_ID, "first")
    with pytest.raises(ValueError, match="KERAS_ELASTIC_WORKER_ID='first' is not an "
                       "integer"):
        cluster_env.read()
    monkeypatch.setenv(cluster_env.CONNECT_TIMEOUT, "soon")
    with pytest.raises(ValueError, match="KERAS_ELASTIC_CONNECT_TIMEOUT='soon' is not a "
                       "number of seconds"):
        cluster_env.connect_timeout()
    monkeypatch.setenv(cluster_env.LIVENESS_TIMEOUT, "soon")
    with pytest.raises(ValueError, match="KERAS_ELASTIC_LIVENESS_TIMEOUT='soon' is "
                       "not a number of seconds"):
        cluster_env.call_deadline(10)


def test_model_def_file_errors(tmp_path):
    with pytest.raises(ModelDefError, match="file .*missing.py does not exist"):
        check_model_def(f"{tmp_path}/missing.py:f")
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(ModelDefError, match="broken.py has a syntax error"):
        check_model_def(f"{broken}:f")
    good = tmp_path / "good.py"
    good.write_text("import keras\n\ndef f():\n    pass\n\ndataset_fn = None\n")
    assert check_model_def(f"{good}:f") == str(good)


@pytest.mark.multiprocess
def test_service_that_dies_at_start_is_reported_with_its_log(tmp_path):
    with pytest.raises(ProcessStartError, match="(?s)the master process exited with "
                       "code 1 before serving.*No module named "
                       "keras_elastic.no_such_service"):
        start_service("master", "keras_elastic.no_such_service", [], str(tmp_path))


@pytest.mark.multiprocess
def test_missing_grpc_modules_are_a_clear_error_and_the_named_command_makes_them(
        tmp_path):
    """Importing never generates code: a copy of the package without its
    generated modules says what to run, and running it makes them."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import REPO

    copy = tmp_path / "keras_elastic"
    shutil.copytree(os.path.join(REPO, "keras_elastic"), copy,
                    ignore=shutil.ignore_patterns("*_pb2.py", "*_pb2_grpc.py",
                                                  "__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    probe = [sys.executable, "-c", "import keras_elastic.proto as p; "
             "print(p.master_pb2.GetTaskResponse.WAIT)"]
    refused = subprocess.run(probe, capture_output=True, text=True, env=env,
                             cwd=str(tmp_path), timeout=120)
    assert refused.returncode != 0
    generator = copy / "proto" / "_generate.py"
    assert ("the gRPC modules of keras_elastic.proto in "
            f"{copy / 'proto'} are missing (tensor, master, ps, fencing)") in refused.stderr
    assert f"to generate them now: python {generator}" in refused.stderr
    assert not list((copy / "proto").glob("*_pb2.py"))  # nothing written
    subprocess.run([sys.executable, str(generator)], check=True, env=env,
                   timeout=120)
    made = subprocess.run(probe, capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout.strip() == "1"
    # In a checkout (setup.py beside the package), an edited .proto is found.
    (tmp_path / "setup.py").write_text("")
    proto = copy / "proto" / "ps.proto"
    later = os.path.getmtime(copy / "proto" / "ps_pb2.py") + 10
    os.utime(proto, (later, later))
    stale = subprocess.run(probe, capture_output=True, text=True, env=env,
                           cwd=str(tmp_path), timeout=120)
    assert stale.returncode != 0
    assert "are older than their .proto files (ps)" in stale.stderr
