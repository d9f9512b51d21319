"""tools/testbed.py, the testbed's command line (docs/testbed.md): up, shape,
cut, heal, partition by port, down; each checked in the namespaces it made.
Skipped only where network namespaces cannot be made (not root)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, subprocess_env
from support import testbed

pytestmark = pytest.mark.multiprocess

TOOL = os.path.join(REPO, "tools", "testbed.py")


def tool(*args: str) -> str:
    result = subprocess.run([sys.executable, TOOL, *args], env=subprocess_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_command_line_makes_shapes_cuts_and_removes_machines():
    if why := testbed.unavailable():
        pytest.skip(f"no testbed: {why}")
    made = json.loads(tool("up", "2"))
    name = made["name"]
    try:
        bed = testbed.Testbed.attach(name)
        assert list(made["machines"].values()) == [bed.address(0), bed.address(1)]
        assert bed.address(0).startswith(("198.18.", "198.19."))
        assert bed.reaches(1, 0)
        tool("shape", "1", "--rate", "100mbit", f"--name={name}")
        qdisc = bed.run(1, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc, qdisc
        tool("cut", "1", f"--name={name}")
        assert not bed.reaches(1, 0, timeout=0.5)
        tool("heal", "1", f"--name={name}")
        assert bed.reaches(1, 0)
        tool("partition", "1", "0", "--port", "9", f"--name={name}")
        assert not bed.reaches(1, 0, port=9, timeout=0.5)
        assert bed.reaches(1, 0, port=10)  # other ports still answer
        tool("unpartition", "1", "0", "--port", "9", f"--name={name}")
        assert bed.reaches(1, 0, port=9)
        assert f"{bed.address(1)}/24" in tool(f"--name={name}", "exec", "1", "--",
                                              "ip", "-brief", "addr", "show", "eth0")
    finally:
        tool("down", f"--name={name}")
    assert name not in testbed.testbeds()
    assert not [ns for ns in testbed._namespaces() if ns.startswith(f"{name}-")]
