"""The job token, TLS and the bind checks (issue 9, parts 3 and 4).

Every server here listens on 127.0.0.1 and every call goes there: binding
beyond loopback is only ever refused, never done.
"""

import json
import os
import secrets
import stat
import subprocess
import sys

import grpc
import numpy as np
import pytest
from conftest import REPO, launch, subprocess_env, wait_for

from keras_elastic.common import auth, rpc, tls
from keras_elastic.common.tensor_codec import encode_all
from keras_elastic.master.client import MasterClient
from keras_elastic.master.server import MasterServer
from keras_elastic.proto import master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc
from keras_elastic.ps import ParameterServer, PSClient
from keras_elastic.ps.update import Update

SGD = {"class_name": "SGD", "config": {"learning_rate": 1.0}}
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def test_token_file_is_private_and_checked(tmp_path):
    path = auth.write_token_file(str(tmp_path), "abc123")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert auth.read_token_file(str(tmp_path)) == "abc123"
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="accessible to other users.*chmod 600"):
        auth.read_token_file(str(tmp_path))
    with pytest.raises(ValueError, match="cannot read the job token"):
        auth.read_token_file(str(tmp_path / "elsewhere"))


def _stubs(address_master, address_ps, token):
    """Raw stubs of clients that send no token (None) or `token`."""
    channels = [grpc.insecure_channel(a) for a in (address_master, address_ps)]
    if token is not None:
        channels = [auth.with_token(c, token) for c in channels]
    return (master_pb2_grpc.MasterStub(channels[0]),
            ps_pb2_grpc.ParameterServerStub(channels[1]), channels)


@pytest.mark.parametrize("token", [None, "wrong-" + "0" * 58], ids=["none", "wrong"])
def test_calls_without_the_token_are_refused_and_change_nothing(token, caplog):
    master, ps = MasterServer(), ParameterServer()
    try:
        good = MasterClient(master.address, worker_id=0, connect_timeout=10)
        good.register_worker()
        good.register_dataset(master_pb2.RegisterDatasetRequest(
            dataset="train", mode="training", records_per_task=5, num_epochs=1,
            shards=[master_pb2.Shard(name="a", num_records=10)]))
        ps_client = PSClient([ps.address], worker_id=0, connect_timeout=10)
        ps_client.init({"w": (np.ones(3, np.float32), True)}, SGD)
        before = ps_client.pull()

        master_stub, ps_stub, channels = _stubs(master.address, ps.address, token)
        header = ps_pb2.PushHeader(worker_id=0, base_version=ps_client.versions[0])
        tensors = list(encode_all([("w", np.full(3, 5, np.float32))],
                                  chunk_bytes=1 << 30))
        calls = {
            "GetTask": lambda: master_stub.GetTask(master_pb2.GetTaskRequest(
                worker_id=0, dataset="train", epoch=0), timeout=10),
            "PushSmall": lambda: ps_stub.PushSmall(
                ps_pb2.PushBundle(header=header, tensors=tensors), timeout=10),
            "Push": lambda: list(ps_stub.Push(iter(
                [ps_pb2.PushRequest(header=header)] +
                [ps_pb2.PushRequest(chunk=c) for c in tensors]), timeout=10)),
            "Pull": lambda: list(ps_stub.Pull(ps_pb2.PullRequest(since_version=-1),
                                              timeout=10)),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == UNAUTHENTICATED, name
            assert "missing or wrong job token" in refused.value.details(), name
        # The standard health check answers without the token (what the
        # launcher and Kubernetes' gRPC probes call), and tells nothing more.
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        for channel in channels:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        for channel in channels:
            channel.close()
        # Logged, naming the method and the caller.
        assert any("refused /keras_elastic." in r.getMessage() and "127.0.0.1" in
                   r.getMessage() for r in caplog.records), caplog.text

        # Nothing changed: no task handed out, no gradient applied.
        status = good.status()
        assert status["datasets"]["train"]["doing"] == 0
        assert status["workers"]["alive"] == [0]
        after = ps_client.pull()
        np.testing.assert_array_equal(after["w"], before["w"])
        # And the job's own clients are served as before.
        assert good.get_task("train", 0).task_id == 0
        np.testing.assert_allclose(
            ps_client.send(Update(grads={"w": np.ones(3, np.float32)})).values["w"],
                                   [0, 0, 0])
        good.close()
        ps_client.close()
    finally:
        master.stop(0)
        ps.stop(0)


@pytest.mark.multiprocess
def test_refusing_to_bind_beyond_loopback_in_clear_text(tmp_path, monkeypatch):
    monkeypatch.delenv(tls.TLS_ENV, raising=False)
    monkeypatch.delenv(tls.INSECURE_ENV, raising=False)
    assert tls.is_loopback("127.0.0.1") and tls.is_loopback("localhost")
    assert not tls.is_loopback("0.0.0.0") and not tls.is_loopback("10.0.0.1")
    server = rpc.make_server(max_workers=1)
    # Checked before binding anything.
    with pytest.raises(ValueError, match="refusing to serve on 0.0.0.0 without TLS"):
        rpc.bind(server, "0.0.0.0", 0)

    job_dir = tmp_path / "job"
    result = subprocess.run(
        [sys.executable, "-m", "keras_elastic", "run", "--bind=0.0.0.0",
         "--advertise=node-3", "--notls", f"--job_dir={job_dir}", "--",
         sys.executable, "-c", "pass"],
        env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "refusing to serve on 0.0.0.0 without TLS" in result.stderr
    assert "--tls" in result.stderr and "--insecure" in result.stderr
    assert not job_dir.exists()  # nothing was started

    from keras_elastic.launcher import LaunchConfig

    with pytest.raises(ValueError, match="give --advertise"):
        LaunchConfig(bind="0.0.0.0", insecure=True).validate()
    with pytest.raises(ValueError, match="--tls_cert and --tls_key go together"):
        LaunchConfig(tls_cert="cert.pem").validate()
    LaunchConfig(bind="0.0.0.0", advertise="node-3", insecure=True).validate()
    LaunchConfig(bind="0.0.0.0", advertise="node-3", tls=True).validate()
    # Beyond loopback TLS is on by itself; clear text only when asked for.
    assert LaunchConfig(bind="0.0.0.0", advertise="node-3").tls_on
    assert not LaunchConfig(bind="0.0.0.0", advertise="node-3", insecure=True).tls_on
    assert not LaunchConfig().tls_on and LaunchConfig(tls=True).tls_on
    with pytest.raises(ValueError, match="without TLS"):
        LaunchConfig(bind="0.0.0.0", advertise="node-3", tls=False).validate()


def test_tls_server_refuses_clients_without_the_ca(tmp_path, monkeypatch):
    config = tls.make_self_signed(str(tmp_path / "tls"), ["127.0.0.1"])
    assert stat.S_IMODE(os.stat(config.key).st_mode) == 0o600
    for name, value in config.to_env().items():
        monkeypatch.setenv(name, value)
    master = MasterServer()
    try:
        assert MasterClient(master.address, connect_timeout=10).status()["error"] is None
        other = tls.make_self_signed(str(tmp_path / "other"), ["127.0.0.1"])
        for credentials in (None, grpc.ssl_channel_credentials(),
                            other.channel_credentials()):
            channel = (grpc.insecure_channel(master.address) if credentials is None
                       else grpc.secure_channel(master.address, credentials))
            stub = master_pb2_grpc.MasterStub(auth.with_token(channel, auth.job_token()))
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetStatus(master_pb2.StatusRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            channel.close()
    finally:
        master.stop(0)


@pytest.mark.multiprocess
def test_job_with_tls_runs_end_to_end_and_refuses_outsiders(tmp_path):
    records = 128
    data = tmp_path / "data"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import counting_script as c; "
            f"c.write_data(sys.argv[2], {records}, 2)")
    subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "tests", "scripts"),
                    str(data)], check=True, env=subprocess_env(), timeout=120)
    job_dir = tmp_path / "job"
    out = tmp_path / "out.json"
    job_token = secrets.token_hex(32)  # not this test process's token
    # The worker holds after its 2nd batch until the checks are done (it
    # writes hold/held-0, waits for hold/go): the job is running for every
    # check, however long they take on a loaded machine.
    hold = tmp_path / "hold"
    hold.mkdir()
    job = launch(str(job_dir), os.path.join(REPO, "tests", "scripts", "counting_script.py"),
                 "--tls", "--num_workers=1",
                 script_args=(f"--data={data}/*.tfrecord", "--epochs=1", f"--output={out}",
                              f"--hold_dir={hold}"),
                 background=True, env={auth.TOKEN_ENV: job_token})
    try:
        wait_for(lambda: (hold / "held-0").exists() or job.poll() is not None,
                 timeout=300, what="the worker holding after its 2nd batch")
        cluster = wait_for(lambda: _cluster(job_dir), timeout=120, what="cluster.json")
        assert cluster["tls"] == {"ca": str(job_dir / "tls" / "cert.pem")}
        assert auth.read_token_file(str(job_dir)) == job_token
        address = cluster["master"]
        assert address.startswith("127.0.0.1:")
        with open(cluster["tls"]["ca"], "rb") as f:
            ca = grpc.ssl_channel_credentials(root_certificates=f.read())

        def get_task(channel, token):
            stub = master_pb2_grpc.MasterStub(auth.with_token(channel, token))
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetTask(master_pb2.GetTaskRequest(worker_id=0, dataset="training",
                                                       return_on_wait=True), timeout=10)
            channel.close()
            return refused.value.code()

        # No CA (clear text, or the system's CAs): no connection at all.
        assert get_task(grpc.insecure_channel(address), job_token) == \
            grpc.StatusCode.UNAVAILABLE
        assert get_task(grpc.secure_channel(address, grpc.ssl_channel_credentials()),
                        job_token) == grpc.StatusCode.UNAVAILABLE
        # The CA but another job's token (this process's).
        assert get_task(grpc.secure_channel(address, ca), auth.job_token()) == \
            UNAUTHENTICATED
        # `keras-elastic join` gives its worker the job's token and CA.
        probe = ("import os; from keras_elastic.master.client import MasterClient; "
                 "c = MasterClient(os.environ['KERAS_ELASTIC_MASTER'], connect_timeout=30);"
                 " print('joined', c.status()['error'] is None)")
        env = subprocess_env()
        env.pop(auth.TOKEN_ENV)
        joined = subprocess.run(
            [sys.executable, "-m", "keras_elastic", "join", f"--job_dir={job_dir}", "--",
             sys.executable, "-c", probe], env=env, capture_output=True, text=True,
            timeout=120)
        assert "joined True" in joined.stdout, joined.stdout + joined.stderr
        assert job.poll() is None, "the job ended before the checks"
        (hold / "go").touch()
        output, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, output[-4000:]
    counts = json.loads(out.read_text())["counts"]
    assert counts == [float(records)] * len(counts), output[-3000:]
    assert "missing or wrong job token" in (job_dir / "master.log").read_text()


def _cluster(job_dir):
    try:
        return json.loads((job_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return None
