"""`keras-elastic run --backend ray` on a real Ray cluster of this machine (issue 11).

One Ray cluster for the module (`ray.cluster_utils.Cluster`: a head node and
worker nodes, real raylets, every node with node IP 127.0.0.1; tests never use
another address). Removing a node is a real node loss: its raylet, the actors
on it and the roles they run die. Custom resources steer placement: the head
offers `head_slot` (the master goes there, and the launcher's driver attaches
to it), every other node one `worker_slot` and one `ps_slot`, so two workers
always land on different nodes.

The counting model (`counting_script.py`) has weights that count the record
gradients applied: exact after the job only if every record's gradient was
applied exactly once, whatever node left meanwhile.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from conftest import (
    REPO,
    assert_exactly_once,
    job_status,
    read_ledger,
    subprocess_env,
    wait_for,
)

ray = pytest.importorskip("ray", reason="the Ray tests need `pip install -e \".[ray]\"`")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.multiprocess]

LOOPBACK = "127.0.0.1"
OBJECT_STORE = 80 * 1024 * 1024
# Ray turns a loopback cluster address into the machine's routable one unless
# clusters are "disabled" (then its own address stays 127.0.0.1).
RAY_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SCRIPT = os.path.join(REPO, "tests", "scripts", "counting_script.py")
DIGITS = os.path.join(REPO, "examples", "digits")
RECORDS = 1024
TASKS_PER_EPOCH = 16  # 1024 records / (batch 16 x 4 minibatches per task)
PLACEMENT = ('--worker_resources={"worker_slot": 1}', '--ps_resources={"ps_slot": 1}',
             '--master_resources={"head_slot": 1}')


class RayNodes:
    """The module's Ray cluster: a head node and worker nodes to remove and add."""

    def __init__(self) -> None:
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=1, node_ip_address=LOOPBACK, include_dashboard=False,
            object_store_memory=OBJECT_STORE, resources={"head_slot": 1},
            _system_config={"health_check_period_ms": 1000}))
        self.nodes: dict[str, object] = {}  # node id -> ray._private.node.Node

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, **resources) -> str:
        node = self.cluster.add_node(
            num_cpus=2, node_ip_address=LOOPBACK, object_store_memory=OBJECT_STORE,
            resources=resources or {"worker_slot": 1, "ps_slot": 1})
        self.nodes[node.node_id] = node
        return node.node_id

    def remove(self, node_id: str) -> None:
        self.cluster.remove_node(self.nodes.pop(node_id))

    def ensure(self, count: int) -> list[str]:
        """Exactly `count` worker nodes (besides the head)."""
        while len(self.nodes) > count:
            self.remove(next(iter(self.nodes)))
        while len(self.nodes) < count:
            self.add()
        return list(self.nodes)


@pytest.fixture(scope="module")
def ray_nodes():
    saved = {k: os.environ.get(k) for k in RAY_LOOPBACK_ENV}
    os.environ.update(RAY_LOOPBACK_ENV)
    nodes = RayNodes()
    try:
        nodes.ensure(2)
        yield nodes
    finally:
        nodes.cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def counting_data(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("counting"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import counting_script as c; "
            f"c.write_data(sys.argv[2], {RECORDS}, 4)")
    subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "tests", "scripts"),
                    directory], check=True, env=subprocess_env(), timeout=120)
    return os.path.join(directory, "*.tfrecord")


def ray_job(nodes: RayNodes, job_dir, command, *flags, background=False,
            timeout=400, address=None):
    """`keras-elastic run --backend ray FLAGS -- COMMAND` as a real process tree."""
    argv = [sys.executable, "-m", "keras_elastic", "run", "--backend=ray",
            f"--ray_address={address or nodes.address}", f"--job_dir={job_dir}",
            "--progress_interval=2", *flags, "--", *command]
    env = subprocess_env(**RAY_LOOPBACK_ENV)
    if background:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def counting_job(nodes, tmp_path, data, *flags, epochs=2, sleep=0.1,
                 script_args=()):
    out = tmp_path / "out.json"
    command = [sys.executable, SCRIPT, f"--data={data}", f"--epochs={epochs}",
               f"--output={out}", f"--sleep_per_batch={sleep}", *script_args]
    return out, ray_job(nodes, tmp_path / "job", command, *PLACEMENT, *flags,
                        background=True)


def finish(proc, timeout=400) -> str:
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return output


def check_exact(tmp_path, out, output: str, epochs=2) -> dict:
    """The job succeeded and every weight counts each record once per epoch."""
    assert os.path.exists(out), output[-4000:]
    result = json.loads(out.read_text())
    assert result["counts"] == [epochs * RECORDS] * len(result["counts"]), (
        result, output[-4000:])
    ledger = read_ledger(str(tmp_path / "job"))["training"]
    assert_exactly_once(ledger, num_epochs=epochs, tasks_per_epoch=TASKS_PER_EPOCH)
    return result


def cluster_file(job_dir) -> dict:
    try:
        with open(os.path.join(job_dir, "cluster.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def training(job_dir) -> dict:
    status = job_status(str(job_dir))
    return (status or {}).get("datasets", {}).get("training") or {}


def summary_of(tmp_path) -> dict:
    return json.loads((tmp_path / "job" / "summary.json").read_text())


def nodes_of(summary: dict, role: str) -> list[str]:
    return [p["node"] for p in summary["placements"] if p["role"] == role]


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


# -- the digits example on three nodes ------------------------------------------
def test_digits_two_workers_on_two_nodes_reaches_95_percent(ray_nodes, tmp_path):
    workers_nodes = ray_nodes.ensure(2)
    data_dir = tmp_path / "digits"
    subprocess.run([sys.executable, os.path.join(DIGITS, "prepare_data.py"),
                    f"--output_dir={data_dir}", "--num_shards=2"], check=True,
                   env=subprocess_env(), timeout=300, capture_output=True)
    out = tmp_path / "metrics.json"
    # TLS on loopback too: a job-made certificate names the job, not the nodes.
    result = ray_job(ray_nodes, tmp_path / "job",
                     [sys.executable, os.path.join(DIGITS, "train.py"), "--epochs=4",
                      f"--data_dir={data_dir}", "--noprepare", f"--output={out}"],
                     "--num_workers=2", "--num_ps=1", "--tls", *PLACEMENT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    metrics = json.loads(out.read_text())
    assert metrics["val_accuracy"] >= 0.95, metrics
    summary = summary_of(tmp_path)
    assert summary["backend"] == "ray" and summary["workers_lost"] == 0
    w0, w1 = nodes_of(summary, "worker-0"), nodes_of(summary, "worker-1")
    assert w0 and w1 and w0[0] != w1[0], summary["placements"]
    assert {w0[0], w1[0]} == set(workers_nodes)
    assert nodes_of(summary, "ps-0")[0] in workers_nodes
    cluster = cluster_file(tmp_path / "job")
    assert cluster["tls"]["server_name"] == "keras-elastic.job", cluster


def test_several_parameter_servers_share_one_node(ray_nodes, tmp_path, counting_data):
    """docs/ray.md's several servers on one machine: a resource that one node
    offers, a share of it asked per server, and the servers land on that
    node together (not spread); the job is exact."""
    ray_nodes.ensure(2)
    out, proc = counting_job(ray_nodes, tmp_path, counting_data, "--num_workers=2",
                             "--num_ps=2", '--ps_resources={"head_slot": 0.25}',
                             '--master_resources={"head_slot": 0.25}', epochs=1,
                             sleep=0.0)
    output = finish(proc)
    check_exact(tmp_path, out, output, epochs=1)
    summary = summary_of(tmp_path)
    head = nodes_of(summary, "master")
    assert nodes_of(summary, "ps-0") == nodes_of(summary, "ps-1") == head, (
        summary["placements"])
    assert head[0] not in ray_nodes.nodes  # the head, not a worker node


# -- elasticity: nodes leave and join ---------------------------------------------
def test_worker_node_removed_mid_epoch_job_finishes_exact(ray_nodes, tmp_path,
                                                          counting_data):
    """The lost worker's tasks are requeued; with no room for a replacement its
    slot waits, and a node that joins gets it."""
    ray_nodes.ensure(2)
    job_dir = tmp_path / "job"
    hold = tmp_path / "hold"
    hold.mkdir()
    # Both workers stop after their 2nd batch, holding a task, until the test
    # has removed the node (counting_script --hold_dir): nothing races.
    out, proc = counting_job(ray_nodes, tmp_path, counting_data, "--num_workers=2",
                             "--num_ps=1", "--max_worker_restarts=2",
                             script_args=(f"--hold_dir={hold}",))
    try:
        wait_for(lambda: {p.name for p in hold.iterdir()} >= {"held-0", "held-1"}
                 or proc.poll() is not None, timeout=240, what="both workers mid-task")
        assert proc.poll() is None, finish(proc)[-4000:]
        cluster = cluster_file(job_dir)
        nodes = cluster["nodes"]
        victim = next(name for name in ("worker-0", "worker-1")
                      if nodes[name] != nodes["ps-0"])
        pid = cluster["worker_pids"][victim.split("-")[1]]
        ray_nodes.remove(nodes[victim])
        wait_for(lambda: pid_gone(pid), timeout=30, what=f"{victim}'s process to die")
        # Its node had the only free worker slot: the replacement waits for room
        # (the launcher says so in cluster.json), and none is placed.
        wait_for(lambda: cluster_file(job_dir).get("worker_slots_pending") == 1,
                 timeout=60, what="the replacement waiting for room")
        assert "worker-2" not in cluster_file(job_dir)["nodes"]
        (hold / "go").write_text("")
        new_node = ray_nodes.add()
        wait_for(lambda: cluster_file(job_dir)["nodes"].get("worker-2"), timeout=60,
                 what="the replacement placed")
        output = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    assert f"worker {victim.split('-')[1]} lost with its node {nodes[victim]}" in output, (
        output[-4000:])
    assert "no room for a new worker on ray now" in output, output[-4000:]
    summary = summary_of(tmp_path)
    assert summary["workers_lost"] == 1 and summary["worker_restarts"] == 1, summary
    assert summary["worker_slots_pending"] == 0
    assert nodes_of(summary, "worker-2") == [new_node], summary["placements"]
    check_exact(tmp_path, out, output)


def test_parameter_server_node_removed_job_recovers_exact(ray_nodes, tmp_path,
                                                          counting_data):
    ray_nodes.ensure(2)
    job_dir = tmp_path / "job"
    hold = tmp_path / "hold"
    hold.mkdir()
    # Both workers stop after their 2nd batch (counting_script --hold_dir)
    # until an automatic checkpoint of the trained model exists and the
    # server's node is gone: nothing races the job.
    out, proc = counting_job(ray_nodes, tmp_path, counting_data, "--num_workers=2",
                             "--num_ps=1", "--ps_checkpoint_secs=2",
                             "--max_worker_restarts=2",
                             script_args=(f"--hold_dir={hold}",))
    try:
        wait_for(lambda: {p.name for p in hold.iterdir()} >= {"held-0", "held-1"}
                 or proc.poll() is not None, timeout=240, what="both workers mid-task")
        assert proc.poll() is None, finish(proc)[-4000:]
        wait_for(lambda: list((job_dir / "ps_checkpoints").glob("ckpt-*/manifest.json")),
                 timeout=60, what="an automatic checkpoint")
        cluster = cluster_file(job_dir)
        old_node, old_address = cluster["nodes"]["ps-0"], cluster["ps"][0]
        ray_nodes.remove(old_node)  # the parameter server and a worker with it
        (hold / "go").write_text("")
        output = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    summary = summary_of(tmp_path)
    assert summary["ps_restarts"] == 1, summary
    recovery = summary["ps_recoveries"][0]
    assert recovery["reason"] == f"lost with its node {old_node}", recovery
    assert "ckpt-" in recovery["checkpoint"], recovery
    # Back on the other node, at another address the workers followed.
    assert nodes_of(summary, "ps-0")[-1] not in (old_node, None), summary["placements"]
    assert cluster_file(job_dir)["ps"][0] != old_address
    result = check_exact(tmp_path, out, output)
    assert all(p["incarnation"] for p in result["ps"])


def test_node_added_during_the_job_gets_a_worker(ray_nodes, tmp_path, counting_data):
    ray_nodes.ensure(1)  # one worker slot: the job starts below --max_workers
    job_dir = tmp_path / "job"
    hold = tmp_path / "hold"
    hold.mkdir()
    # Worker 0 stops after its 2nd batch until the node is added and a second
    # worker placed there (counting_script --hold_dir): the job cannot end first.
    out, proc = counting_job(ray_nodes, tmp_path, counting_data, "--num_workers=1",
                             "--max_workers=2", "--num_ps=1", epochs=3,
                             script_args=(f"--hold_dir={hold}",))
    try:
        wait_for(lambda: (hold / "held-0").exists() or proc.poll() is not None,
                 timeout=240, what="worker 0 mid-task")
        assert proc.poll() is None, finish(proc)[-4000:]
        new_node = ray_nodes.add()
        wait_for(lambda: cluster_file(job_dir).get("nodes", {}).get("worker-1"),
                 timeout=60, what="a second worker placed")
        assert cluster_file(job_dir)["nodes"]["worker-1"] == new_node
        (hold / "go").write_text("")
        output = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    summary = summary_of(tmp_path)
    assert nodes_of(summary, "worker-1") == [new_node], summary["placements"]
    assert summary["workers_lost"] == 0
    check_exact(tmp_path, out, output, epochs=3)


# -- clear errors before anything starts --------------------------------------------
def assert_refused(result, job_dir, *fragments):
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    for fragment in fragments:
        assert fragment in output, output[-3000:]
    started = [n for n in os.listdir(job_dir) if n.endswith(".log")] if os.path.isdir(
        job_dir) else []
    assert not started, started


def test_roles_run_at_the_launchers_niceness_not_rays_background_15(ray_nodes,
                                                                    tmp_path):
    # Ray starts its workers at niceness 15; a role is the job's main work.
    probe = "import os; print('niceness', os.nice(0), flush=True)"
    result = ray_job(ray_nodes, tmp_path / "job", [sys.executable, "-c", probe],
                     "--num_workers=1", "--num_ps=1", timeout=200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    with open(tmp_path / "job" / "worker-0.log") as f:
        assert f"niceness {os.nice(0)}" in f.read().splitlines()


def test_backend_ray_without_ray_installed_says_how_to_install(tmp_path):
    job_dir = tmp_path / "job"
    code = ("import sys; sys.modules['ray'] = None; from keras_elastic.cli import main; "
            "sys.exit(main(sys.argv))")
    result = subprocess.run(
        [sys.executable, "-c", code, "run", "--backend=ray", f"--job_dir={job_dir}",
         "--", sys.executable, SCRIPT], env=subprocess_env(), capture_output=True,
        text=True, timeout=60)
    assert_refused(result, job_dir, "--backend ray needs Ray",
                   'pip install "keras-elastic[ray]"', 'pip install -e ".[ray]"')


def test_unreachable_ray_address_is_refused_at_once(ray_nodes, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    started = time.time()
    result = ray_job(ray_nodes, tmp_path / "job", [sys.executable, SCRIPT],
                     address=f"{LOOPBACK}:{port}", timeout=120)
    assert_refused(result, tmp_path / "job",
                   f"cannot reach the Ray cluster at {LOOPBACK}:{port}")
    assert time.time() - started < 60


def test_resources_no_node_has_are_refused_before_training(ray_nodes, tmp_path):
    result = ray_job(ray_nodes, tmp_path / "job", [sys.executable, SCRIPT],
                     '--worker_resources={"GPU": 4}', timeout=120)
    assert_refused(result, tmp_path / "job", "no node of the Ray cluster can run a "
                   "worker: --worker_resources asks for {'GPU': 4}")


# A worker node started the way Cluster.add_node starts one, from a process
# that can live in another mount namespace.
_NODE = """
import signal, sys, time
from ray._private.node import Node
from ray._private.parameter import RayParams
params = RayParams(gcs_address=sys.argv[1], node_ip_address="127.0.0.1", num_cpus=1,
                   num_gpus=0, object_store_memory=int(sys.argv[2]),
                   resources={"hidden_node": 1}, min_worker_port=0, max_worker_port=0,
                   include_log_monitor=False, node_manager_port=0)
params.dashboard_agent_listen_port = None
node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
print("node", node.node_id, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


@contextlib.contextmanager
def node_hiding(ray_nodes, hidden: str):
    """A Ray node in a mount namespace of its own where `hidden` (a folder) is
    an empty tmpfs: as if the job's storage were not mounted there."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to give a node its own mounts")
    # Skipped only when this sandbox cannot make a mount namespace at all;
    # once it can, a node that does not start is a failure, not a skip.
    probe = subprocess.run(["unshare", "-rm", "sh", "-c",
                            f"mount -t tmpfs tmpfs {hidden}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("this sandbox cannot give a process its own mounts: "
                    f"{probe.stderr.strip()[-400:]}")
    command = f'mount -t tmpfs tmpfs {hidden} && exec "$0" -c "$1" "$2" "$3"'
    node = subprocess.Popen(
        ["unshare", "-rm", "sh", "-c", command, sys.executable, _NODE,
         ray_nodes.address, str(OBJECT_STORE)], env=subprocess_env(**RAY_LOOPBACK_ENV),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        first = node.stdout.readline()
        if not first.startswith("node "):
            rest = node.communicate(timeout=30)[0]
            pytest.fail(f"the Ray node with its own mounts did not start: "
                        f"{first}{rest}"[-1500:])
        yield first.split()[1]
    finally:
        if node.poll() is None:
            node.terminate()
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()


def test_job_dir_not_visible_from_a_node_is_refused_before_training(ray_nodes,
                                                                    tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    with node_hiding(ray_nodes, str(shared)) as hidden:
        result = ray_job(ray_nodes, shared / "job", [sys.executable, SCRIPT],
                         timeout=180)
    assert_refused(result, shared / "job", "is not visible from every node of the Ray "
                   f"cluster (node {hidden} (127.0.0.1): No such file or directory",
                   "put --job_dir on storage every node mounts")
