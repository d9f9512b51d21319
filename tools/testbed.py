"""Machines on one machine, by hand: the command line of
tests/support/testbed.py (network namespaces on a bridge, 198.18.0.0/15
addresses; root only).

```
python tools/testbed.py up 3                  # prints the testbed's name, addresses
python tools/testbed.py exec 0 -- python -m keras_elastic run --bind=198.18.K.1 ...
python tools/testbed.py exec 1 -- python -m keras_elastic join --job_dir=...
python tools/testbed.py cut 1                 # pull machine 1's cable
python tools/testbed.py heal 1
python tools/testbed.py partition 1 2 [--port P]   # 1 and 2 cannot reach each other
python tools/testbed.py shape 1 --rate 1gbit  # tbf on machine 1's link
python tools/testbed.py list
python tools/testbed.py down                  # --name NAME when several are up
python tools/testbed.py clean [--all]         # leftovers of dead owners (--all: every one)
```

A testbed made here is kept until `down` (or `clean --all`); those of test
runs are removed by their owner, or by `clean` once their owner is dead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))

from support import testbed  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("name", None, "The testbed (default: the only one made here).")
flags.DEFINE_string("rate", "1gbit", "shape: the link's rate (tc's units).")
flags.DEFINE_string("burst", "256kb", "shape: tbf's burst.")
flags.DEFINE_integer("port", None, "partition: only TCP to this port on the second "
                     "machine.")
flags.DEFINE_bool("all", False, "clean: every testbed, live owner or not.")

USAGE = "usage: testbed.py up N | down | clean | list | exec M -- CMD | cut M | " \
        "heal M | partition M1 M2 | unpartition M1 M2 | shape M --rate R"


def _bed() -> testbed.Testbed:
    if FLAGS.name:
        return testbed.Testbed.attach(FLAGS.name)
    ours = [n for n, s in testbed.testbeds().items() if s.get("owner") == 0]
    if len(ours) != 1:
        raise app.UsageError(f"{len(ours)} testbeds made here ({', '.join(ours)}): "
                             "give --name")
    return testbed.Testbed.attach(ours[0])


def _machine(bed: testbed.Testbed, text: str) -> int:
    i = ord(text.upper()) - ord("A") if text.isalpha() and len(text) == 1 else int(text)
    bed.machine(i)  # IndexError naming the machines
    return i


def main(argv: list[str]) -> int:
    args = argv[1:]
    if not args:
        raise app.UsageError(USAGE)
    what, rest = args[0], args[1:]
    if what == "up":
        bed = testbed.Testbed(int(rest[0]) if rest else 2, owner=0).up()
        import atexit
        atexit.unregister(bed.down)  # kept until `down`
        print(json.dumps({"name": bed.name, "subnet": bed.subnet,
                          "machines": {bed.machine(i): bed.address(i)
                                       for i in range(bed.n)}}, indent=1))
        return 0
    if what == "clean":
        removed = testbed.clean(everything=FLAGS.all)
        print("removed: " + (", ".join(removed) or "nothing"))
        return 0
    if what == "list":
        print(json.dumps(testbed.testbeds(), indent=1))
        return 0
    bed = _bed()
    if what == "down":
        testbed.remove_testbed(bed.name)
        return 0
    if what == "exec":
        if "--" in rest:
            rest.remove("--")
        if len(rest) < 2:
            raise app.UsageError("exec M -- COMMAND")
        return subprocess.call(bed.argv(_machine(bed, rest[0]), rest[1:]))
    if what in ("cut", "heal"):
        getattr(bed, what)(_machine(bed, rest[0]))
        return 0
    if what in ("partition", "unpartition"):
        bed.rules(
            "add" if what == "partition" else "del", _machine(bed, rest[0]),
            _machine(bed, rest[1]), FLAGS.port)
        return 0
    if what == "shape":
        bed.shape(_machine(bed, rest[0]), FLAGS.rate, FLAGS.burst)
        return 0
    raise app.UsageError(USAGE)


if __name__ == "__main__":
    app.run(main)
