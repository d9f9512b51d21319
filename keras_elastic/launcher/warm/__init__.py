"""Warm role processes: TensorFlow and Keras imported once, roles forked.

A worker or parameter server started afresh spends 4-5 s (on 2 cores) and
about 0.7 GB importing TensorFlow and Keras before it does anything. The
local backend instead starts one *warm process* per job as the launcher
starts (`pool.WarmPool`), which imports them once (`zygote.py`), and forks
each role from it (`child.py`): a role starts in milliseconds, and shares
the imported pages with its siblings. What a role runs is the command the
launcher was given, with its own argv, environment, working directory,
output and exit status, as if started afresh; a command that cannot be run
that way (`command.py`) is started afresh.

- `command.py`: which commands a warm process can run (pure).
- `zygote.py`: the warm process itself (`python -m keras_elastic.launcher.warm`).
- `child.py`: in a fork, becoming the role.
- `pool.py`: the launcher's side: `WarmPool.popen` returns a Popen-like role.
"""
