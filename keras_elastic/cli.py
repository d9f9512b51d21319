"""The `keras-elastic` command.

```
keras-elastic run    [flags] -- python train.py [args]   start a job (this machine,
                                                          or --backend ray)
keras-elastic join   --job_dir DIR -- python train.py    add a worker to a job
keras-elastic scale  --job_dir DIR --num_workers N       resize a running job
keras-elastic status --job_dir DIR | --master ADDR       a job's progress
keras-elastic train | evaluate | predict --model_def=module:function ...
```

Every subcommand takes absl flags; `keras-elastic SUBCOMMAND --help` (or
`-h`) prints its usage and flags, `--helpfull` adds the absl flags every
subcommand accepts. Arguments after `--` are the user's command: they are
passed on untouched (`--help` included).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

from absl import flags, logging

from keras_elastic.common import errors

FLAGS = flags.FLAGS
PROG = "keras-elastic"


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """One `keras-elastic` subcommand."""

    define: Callable[[], None]  # defines its absl flags
    main: Callable[[list[str]], int]  # runs it, given the command after `--`
    summary: str  # one line, for `keras-elastic --help`
    usage: str  # its arguments, after `keras-elastic NAME`
    description: str  # a paragraph, for `keras-elastic NAME --help`


_SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, summary: str, usage: str, description: str,
               ) -> Callable[[tuple[Callable[[], None], Callable[[list[str]], int]]],
                             None]:
    """Registers the (define, main) pair it is called with as `name`."""
    def register(pair: tuple[Callable[[], None], Callable[[list[str]], int]]) -> None:
        define, main = pair
        _SUBCOMMANDS[name] = Subcommand(define, main, summary, usage, description)
    return register


class UsageError(errors.JobError):
    """A wrong flag or argument: printed without a traceback, exit code 2."""


# -- run ------------------------------------------------------------------
_DEFINE = {int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string, bool: flags.DEFINE_bool}


def _define_run() -> None:
    """The launcher flags: one per `LaunchConfig` field (launcher/config.py
    holds each one's default and help)."""
    from keras_elastic.launcher.config import launch_flags

    for flag in launch_flags():
        if flag.choices:
            flags.DEFINE_enum(flag.name, flag.default, list(flag.choices), flag.help)
        else:
            _DEFINE[flag.kind](flag.name, flag.default, flag.help)


def _main_run(command: list[str]) -> int:
    from keras_elastic.launcher import LaunchConfig, Launcher

    try:
        config = LaunchConfig.from_flags(lambda name: getattr(FLAGS, name))
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        launcher = Launcher(command, config)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return launcher.run()


subcommand(
    "run", "start master, parameter servers and workers (here, or on Ray)",
    "[flags] -- COMMAND [ARG ...]",
    "Starts a job: a master, --num_ps parameter servers and --num_workers workers, "
    "each worker running COMMAND (everything after `--`, passed on untouched, "
    "--help included), as processes of this machine or, with --backend ray, as "
    "actors on a Ray cluster. The launcher relaunches lost workers, restarts "
    "parameter servers and the master, prints progress lines and ends with a "
    "summary; every process's log is in --job_dir.",
)((_define_run, _main_run))


# -- train / evaluate / predict (ElasticDL-style jobs) --------------------
def _job_subcommand(job: str):
    def define() -> None:
        from keras_elastic.jobs.job_flags import define_job_flags

        _define_run()
        define_job_flags()

    def main(command: list[str]) -> int:
        from keras_elastic.jobs import job_flags

        if command:
            raise UsageError(f"`keras-elastic {job}` runs its own worker program; it "
                             f"takes no command after `--` (got {command})")
        try:
            job_flags.validate(job)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return _main_run([sys.executable, "-m", "keras_elastic.jobs",
                          *job_flags.worker_args(job)])

    return define, main


def _elasticdl_args(flag_args: list[str]) -> list[str]:
    """train/evaluate/predict: ElasticDL's flag names rewritten or refused."""
    from keras_elastic.jobs import job_flags

    try:
        return job_flags.rewrite_elasticdl_args(flag_args)
    except ValueError as e:
        raise UsageError(str(e)) from None


_JOBS = ("train", "evaluate", "predict")

subcommand(
    "train", "train a --model_def on --training_data (ElasticDL-style)",
    "--model_def=MODULE:FUNCTION --training_data=PATTERN [flags]",
    "Runs a training job without a script: the workers build the model of "
    "--model_def and train it on --training_data (TFRecord files), evaluating on "
    "--validation_data if given, and save checkpoints to --checkpoint_dir (resuming "
    "from its latest). The launcher flags are those of `keras-elastic run`; every "
    "flag is checked before any process starts.",
)(_job_subcommand("train"))
subcommand(
    "evaluate", "evaluate the latest checkpoint on --validation_data",
    "--model_def=MODULE:FUNCTION --validation_data=PATTERN --checkpoint_dir=DIR "
    "[flags]",
    "Evaluates the latest checkpoint of --checkpoint_dir (or that checkpoint) on "
    "--validation_data, with the model of --model_def; --output writes the metrics "
    "(JSON). The launcher flags are those of `keras-elastic run`.",
)(_job_subcommand("evaluate"))
subcommand(
    "predict", "predict --prediction_data with the latest checkpoint",
    "--model_def=MODULE:FUNCTION --prediction_data=PATTERN --checkpoint_dir=DIR "
    "[--output=DIR] [flags]",
    "Predicts --prediction_data with the latest checkpoint of --checkpoint_dir (or "
    "that checkpoint): the outputs go to the directory --output, or to the "
    "module's PredictionOutputsProcessor. The launcher flags are those of "
    "`keras-elastic run`.",
)(_job_subcommand("predict"))


# -- join / scale / status -----------------------------------------------
def _read_cluster(job_dir: str) -> dict:
    path = os.path.join(job_dir, "cluster.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist: is a job running with "
                         f"--job_dir={job_dir}?") from None


def _client_env(job_dir: str, cluster: dict) -> dict[str, str]:
    """What a client of the job in `job_dir` needs: its token, and the CA
    when it serves TLS (cluster.json's "tls")."""
    from keras_elastic.common import auth, tls

    try:
        env = {auth.TOKEN_ENV: auth.read_token_file(job_dir)}
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cluster.get("tls"):
        env.update(tls.TLSConfig(ca=cluster["tls"].get("ca"),
                                 server_name=cluster["tls"].get("server_name")).to_env())
    return env


def _use_client_env(env: dict[str, str], job_env: dict[str, str]) -> None:
    """Replaces the token and TLS settings in `env` by the job's."""
    from keras_elastic.common import tls

    for name in (tls.TLS_ENV, tls.CERT_ENV, tls.KEY_ENV, tls.CA_ENV,
                 tls.SERVER_NAME_ENV):
        env.pop(name, None)
    env.update(job_env)


def _define_join() -> None:
    flags.DEFINE_string("job_dir", None, "The running job's --job_dir.")
    flags.DEFINE_float("connect_timeout", None, "Seconds the worker keeps retrying "
                       "a master or parameter server it cannot reach (default: the "
                       "job's --connect_timeout when cluster.json records it, else "
                       f"{_default_connect_timeout()}).")
    flags.DEFINE_integer("max_rejoins", 10, "Times the worker is started again "
                         "when the job presumed it lost (cut off or frozen for "
                         "--heartbeat_timeout: it exits with status 3) while the "
                         "job still runs; it joins as a new worker.")


def _default_connect_timeout() -> float:
    from keras_elastic.common import cluster_env

    return cluster_env.DEFAULT_CONNECT_TIMEOUT


def _main_join(command: list[str]) -> int:
    from keras_elastic.common import job_end

    if not FLAGS.job_dir:
        raise UsageError("--job_dir is required: the directory of the running job")
    if not command:
        raise UsageError("no worker command: put it after `--`")
    cluster = _read_cluster(FLAGS.job_dir)
    if job_end.summary_is_newer(FLAGS.job_dir):
        raise UsageError(f"the job of {FLAGS.job_dir} ended (its summary.json is "
                         "newer than its cluster.json): nothing to join")
    rejoins = 0
    while True:
        code = subprocess.call(command, env=_join_env(FLAGS.job_dir, cluster))
        # Status 3: the job lost this worker (common/job_end.py): it ended
        # without it, or, while it runs, presumed it lost (its tasks went to
        # others); then a new process joins as a new worker, as the launcher
        # starts one again for a worker it launched.
        if (code != job_end.EXIT_LOST or job_end.summary_is_newer(FLAGS.job_dir)
                or rejoins >= FLAGS.max_rejoins):
            return code
        rejoins += 1
        print(f"keras-elastic join: the job presumed this worker lost and still "
              f"runs: joining again as a new worker ({rejoins} of "
              f"--max_rejoins={FLAGS.max_rejoins})", file=sys.stderr, flush=True)
        cluster = _read_cluster(FLAGS.job_dir)  # (services may have moved)


def _join_env(job_dir: str, cluster: dict) -> dict[str, str]:
    """The environment of a worker joining the job of `job_dir`."""
    from keras_elastic.common import cluster_env

    env = dict(os.environ)
    _use_client_env(env, _client_env(job_dir, cluster))
    env.update(cluster_env.to_env(cluster["master"], cluster["ps"], -1, job_dir,
                                  cluster.get("seed")))
    timeout = FLAGS.connect_timeout or cluster.get("connect_timeout")
    if timeout:
        env[cluster_env.CONNECT_TIMEOUT] = str(float(timeout))
    if cluster.get("liveness_timeout"):  # (calls' deadlines and keepalive outlast it)
        env[cluster_env.LIVENESS_TIMEOUT] = str(float(cluster["liveness_timeout"]))
    return env


subcommand(
    "join", "run a worker that joins a running job",
    "--job_dir=DIR -- COMMAND [ARG ...]",
    "Runs COMMAND (everything after `--`, passed on untouched) as one more worker "
    "of the job running with --job_dir: with the job's addresses, token and TLS "
    "settings, from JOB_DIR/cluster.json and JOB_DIR/token. A worker the job "
    "lost (cut off from its master) exits with status 3 when the job ends "
    "without it (JOB_DIR/summary.json).",
)((_define_join, _main_join))


def _define_scale() -> None:
    flags.DEFINE_string("job_dir", None, "The running job's --job_dir.")
    flags.DEFINE_integer("num_workers", None, "Workers the job should have.")
    flags.DEFINE_integer("num_ps", None, "Parameter-server processes the job should "
                         "have (1 to its --ps_partitions): partitions move between "
                         "them while the job trains.")
    flags.DEFINE_string("drain_ps", None, "A parameter-server process (its name in "
                        "cluster.json's ps_hosts, e.g. ps-1) whose partitions move to "
                        "the others before it stops: its machine is being taken away.")
    flags.DEFINE_float("wait_secs", 300.0, "--num_ps, --drain_ps: seconds to wait "
                       "for the launcher's outcome, printed (processes before and "
                       "after, moves, failures); the exit status is 1 when the job "
                       "did not reach what was asked. 0: return once asked.")


def _main_scale(command: list[str]) -> int:
    from keras_elastic.launcher.launcher import DESIRED_WORKERS_FILE
    from keras_elastic.launcher.server_scaler import (
        DESIRED_SERVERS_FILE,
        DRAIN_SERVER_FILE,
        OUTCOMES_FILE,
    )

    asked = {"num_workers": FLAGS.num_workers, "num_ps": FLAGS.num_ps,
             "drain_ps": FLAGS.drain_ps}
    if not FLAGS.job_dir or all(v is None for v in asked.values()):
        raise UsageError("--job_dir and one of --num_workers, --num_ps, --drain_ps "
                         "are required")
    if FLAGS.num_ps is not None and FLAGS.num_ps < 1:
        raise UsageError(f"--num_ps must be at least 1, got {FLAGS.num_ps}")
    if FLAGS.wait_secs < 0:
        raise UsageError(f"--wait_secs must be 0 or more, got {FLAGS.wait_secs}")
    cluster = _read_cluster(FLAGS.job_dir)
    if FLAGS.drain_ps is not None:
        names = [h.get("name") for h in cluster.get("ps_hosts") or ()]
        if FLAGS.drain_ps not in names:
            raise UsageError(f"--drain_ps={FLAGS.drain_ps}: the job's server processes "
                             f"are {', '.join(map(str, names)) or 'unknown'} "
                             "(cluster.json's ps_hosts)")
    outcomes = os.path.join(FLAGS.job_dir, OUTCOMES_FILE)
    seen = len(_read_outcomes(outcomes))
    for value, name, said in (
            (FLAGS.num_workers, DESIRED_WORKERS_FILE, "{} workers"),
            (FLAGS.num_ps, DESIRED_SERVERS_FILE, "{} parameter servers"),
            (FLAGS.drain_ps, DRAIN_SERVER_FILE, "{} drained")):
        if value is None:
            continue
        path = os.path.join(FLAGS.job_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(str(value))
        os.replace(path + ".tmp", path)
        print("asked the launcher for " + said.format(value), flush=True)
    servers = len(cluster.get("ps_hosts") or ())
    if FLAGS.wait_secs == 0 or (FLAGS.num_ps is None and FLAGS.drain_ps is None):
        return 0
    if FLAGS.drain_ps is None and FLAGS.num_ps == servers:
        print(f"the job has {servers} parameter servers already")
        return 0
    request = ({"drain": FLAGS.drain_ps} if FLAGS.drain_ps is not None
               else {"num_ps": FLAGS.num_ps})
    return _report_scaling(request, _await_scaling(outcomes, seen, request,
                                                   cluster.get("launcher_pid")))


def _read_outcomes(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def _await_scaling(path: str, seen: int, request: dict,
                   launcher_pid: int | None) -> dict | str:
    """The launcher's first outcome of `request` after the `seen` it had
    written (launcher/server_scaler.py's OUTCOMES_FILE), or why none came."""
    from keras_elastic.common.pids import pid_alive

    deadline = time.monotonic() + FLAGS.wait_secs
    ended = os.path.join(FLAGS.job_dir, "summary.json")
    while time.monotonic() < deadline:
        for outcome in _read_outcomes(path)[seen:]:
            if outcome.get("request") == request:
                return outcome
        if os.path.exists(ended):
            return "the job ended before the launcher carried it out"
        if isinstance(launcher_pid, int) and not pid_alive(launcher_pid):
            return f"the job's launcher (pid {launcher_pid}) is not running"
        time.sleep(0.2)
    return (f"no outcome within --wait_secs={FLAGS.wait_secs:g} (the launcher goes "
            "on trying; its log and summary.json's ps_scaling will say)")


def _report_scaling(request: dict, outcome: dict | str) -> int:
    """Prints how the request ended; 0 when the job reached what was asked."""
    if isinstance(outcome, str):
        print(f"scale: {outcome}", file=sys.stderr)
        return 1
    if "refused" in outcome:
        print(f"scale: refused: {outcome['refused']}", file=sys.stderr)
        return 1
    print(f"parameter servers: {outcome['servers_before']} -> "
          f"{outcome['servers_after']} processes, {len(outcome['moves'])} "
          f"partition(s) moved in {outcome['seconds']:.1f} s"
          + (f", stopped {', '.join(outcome['stopped'])}" if outcome["stopped"] else ""))
    for failure in outcome["failed"]:
        print(f"  partition {failure['partition']} did not move: {failure['error']}",
              file=sys.stderr)
    reached = (request["drain"] in outcome["stopped"] if "drain" in request
               else outcome["servers_after"] == request["num_ps"])
    if not reached:
        print(f"scale: the job did not reach what was asked ({request}); the "
              "launcher tries again while the request stands", file=sys.stderr)
    return 0 if reached else 1


subcommand(
    "scale", "change the number of workers or parameter servers of a running job",
    "--job_dir=DIR [--num_workers=N] [--num_ps=N] [--drain_ps=NAME]",
    "Asks the launcher of the job running with --job_dir for --num_workers "
    "workers (kept within the job's --min_workers/--max_workers): it starts or "
    "stops workers to match; for --num_ps parameter-server processes (1 to the "
    "job's --ps_partitions): it starts or stops processes and moves partitions "
    "between them while the job trains; --drain_ps moves one process's "
    "partitions to the others, then stops it. For servers it waits for the "
    "outcome (--wait_secs) and prints it, exiting 1 when the job did not reach "
    "what was asked.",
)((_define_scale, _main_scale))


def _define_status() -> None:
    flags.DEFINE_string("job_dir", None, "The running job's --job_dir.")
    flags.DEFINE_string("master", None, "Or the master's address.")


def _main_status(command: list[str]) -> int:
    import grpc

    from keras_elastic.master.client import MasterClient

    address = None
    if FLAGS.job_dir:
        cluster = _read_cluster(FLAGS.job_dir)
        address = cluster["master"]
        _use_client_env(os.environ, _client_env(FLAGS.job_dir, cluster))
    address = FLAGS.master or address
    if not address:
        raise UsageError("give --job_dir or --master")
    try:
        status = MasterClient(address, connect_timeout=5).status()
    except ConnectionError as e:
        print(f"keras-elastic status: {e}", file=sys.stderr)
        return 1
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
        print(f"keras-elastic status: {e.details()}; give --job_dir (the token is "
              "in JOB_DIR/token) or set KERAS_ELASTIC_TOKEN", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1))
    return 0


subcommand(
    "status", "print a running job's progress",
    "--job_dir=DIR | --master=HOST:PORT",
    "Prints the progress of a running job as JSON, asked of its master: found "
    "from --job_dir (which also gives the job's token and TLS settings), or at "
    "--master (then the token comes from KERAS_ELASTIC_TOKEN).",
)((_define_status, _main_status))


# -- help -------------------------------------------------------------------
HELP_ARGS = ("-h", "--help", "-help", "--helpshort", "-helpshort", "-?")
HELPFULL_ARGS = ("--helpfull", "-helpfull")

# Headings of a subcommand's flags, by the module that defines them (in this
# order; with a single group, just "flags").
_FLAG_GROUPS = {"keras_elastic.jobs.job_flags": "job flags",
                "keras_elastic.cli": "launcher flags (as for `keras-elastic run`)"}


def split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """A subcommand's arguments split at the first `--`: (its flags, the
    user's command). The command is passed on untouched: a `--help` in it is
    the command's.

    >>> split_args(["--num_workers=2", "--", "python", "t.py", "--help"])
    (['--num_workers=2'], ['python', 't.py', '--help'])
    """
    if "--" not in args:
        return list(args), []
    split = args.index("--")
    return args[:split], args[split + 1:]


def help_request(flag_args: list[str]) -> str | None:
    """"helpfull" or "help" when the flags (before `--`) ask for help
    (--helpfull; -h, --help, --helpshort, -?), else None."""
    if any(arg in HELPFULL_ARGS for arg in flag_args):
        return "helpfull"
    if any(arg in HELP_ARGS for arg in flag_args):
        return "help"
    return None


def _width() -> int:
    return max(60, min(flags.get_help_width(), 100))


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, _width(), initial_indent=indent,
                         subsequent_indent=indent, break_on_hyphens=False) or [indent]


def _defined_flags() -> dict[str, flags.Flag]:
    """Every flag defined so far, by name, in the order of definition."""
    found: dict[str, flags.Flag] = {}
    for name in FLAGS:
        flag = FLAGS[name]
        found.setdefault(flag.name, flag)
    return found


def _flag_lines(flag: flags.Flag) -> list[str]:
    """One flag as `--help` shows it: its name and value, then its help and
    default, indented."""
    help_text = " ".join((flag.help or "").split())
    values = getattr(flag.parser, "enum_values", None)
    if flag.boolean:
        name = f"--[no]{flag.name}"
    elif values:
        prefix = f"<{'|'.join(values)}>: "
        shown: list[str] = []  # DEBUG|debug: once
        for value in values:
            if value.lower() not in {v.lower() for v in shown}:
                shown.append(value)
        choices = "|".join(shown)
        if len(choices) > 40:  # absl's <a|b|...> prefix stays in the help
            name = f"--{flag.name}=VALUE"
        else:
            name = f"--{flag.name}={choices}"
            if help_text.startswith(prefix):
                help_text = help_text[len(prefix):]
            if len(shown) < len(values):
                help_text += " (upper or lower case)"
    else:
        kind = {"int": "INT", "float": "FLOAT"}.get(flag.flag_type(), "STR")
        name = f"--{flag.name}={kind}"
    if flag.short_name:
        name = f"-{flag.short_name}, {name}"
    default = flag.default
    if isinstance(default, bool):
        default = "true" if default else "false"
    elif not isinstance(default, (int, float)) and default is not None:
        default = flag.default_as_str  # quoted
    if default is not None:  # kept on one line: no-break spaces while wrapping
        help_text += " " + f"(default: {default})".replace(" ", "\xa0")
    return [f"  {name}", *(line.replace("\xa0", " ")
                           for line in _wrap(help_text, "      "))]


def _flag_section(title: str, flag_list: list[flags.Flag]) -> list[str]:
    lines = ["", f"{title}:"]
    for flag in flag_list:
        lines += _flag_lines(flag)
    return lines


def _global_flags(own: set[str]) -> list[flags.Flag]:
    """The flags every subcommand accepts besides its own (absl's)."""
    return [flag for name, flag in _defined_flags().items() if name not in own]


def _elasticdl_note() -> list[str]:
    from keras_elastic.jobs.job_flags import ALIASES

    names = ", ".join(f"--{old} (--{new})" for old, new in ALIASES.items())
    return ["", *_wrap(f"ElasticDL's names are accepted too: {names}. ElasticDL flags "
                       "that do not apply here (--image_name, --volume, ...) are "
                       "refused, saying what to use instead.", "")]


def subcommand_help(name: str, own: list[flags.Flag], full: bool = False) -> str:
    """`keras-elastic NAME --help`: usage, description and `own` flags (the
    subcommand's, defined already); `full` adds absl's flags."""
    sub = _SUBCOMMANDS[name]
    lines = [f"usage: {PROG} {name} {sub.usage}", "", *_wrap(sub.description, "")]
    groups: dict[str, list[flags.Flag]] = {}
    for flag in own:
        module = FLAGS.find_module_defining_flag(flag.name) or ""
        groups.setdefault(module, []).append(flag)
    order = list(_FLAG_GROUPS)
    for module in sorted(groups, key=lambda m: order.index(m) if m in order else
                         len(order)):
        title = _FLAG_GROUPS.get(module, f"flags of {module}") if len(
            groups) > 1 else "flags"
        lines += _flag_section(title, groups[module])
    if name in _JOBS:
        lines += _elasticdl_note()
    if full:
        lines += _flag_section("absl flags (every subcommand accepts them)",
                               _global_flags({flag.name for flag in own}))
    else:
        lines += ["", f"`{PROG} {name} --helpfull` also lists the absl flags every "
                  "subcommand accepts."]
    return "\n".join(lines)


def usage(full: bool = False) -> str:
    """`keras-elastic --help`: the subcommands, one line each."""
    lines = [f"usage: {PROG} SUBCOMMAND [flags] [-- COMMAND [ARG ...]]", "",
             "Elastic parameter-server training for Keras 3 on TensorFlow.", "",
             "subcommands:"]
    lines += [f"  {name:9s} {sub.summary}" for name, sub in _SUBCOMMANDS.items()]
    lines += ["", *_wrap(f"`{PROG} SUBCOMMAND --help` (or -h) prints a subcommand's "
                         "usage and flags; --helpfull adds the absl flags every "
                         "subcommand accepts. Arguments after `--` are your command's, "
                         "passed on untouched.", "")]
    if full:
        lines += _flag_section("absl flags (every subcommand accepts them)",
                               _global_flags(set()))
    return "\n".join(lines)


# -- entry point ----------------------------------------------------------
def _unknown_subcommand(name: str) -> str:
    if name.startswith("-"):
        return (f"{PROG}: unknown flag '{name}' before the subcommand: flags come "
                f"after it ({PROG} SUBCOMMAND [flags])")
    close = difflib.get_close_matches(name, list(_SUBCOMMANDS), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{PROG}: unknown subcommand '{name}'{hint}"


def main(argv: list[str]) -> int:
    """Runs `keras-elastic` with `argv` (argv[0] is the program name); returns
    the exit code (0 for --help, 2 for a wrong flag or argument)."""
    args = argv[1:]
    if args and args[0] == "help":  # `keras-elastic help [SUBCOMMAND]`
        args = [*args[1:2], "--help"]
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    if args[0] in HELP_ARGS or args[0] in HELPFULL_ARGS:
        print(usage(full=args[0] in HELPFULL_ARGS))
        return 0
    name = args[0]
    if name not in _SUBCOMMANDS:
        print(f"{_unknown_subcommand(name)}\n\n{usage()}", file=sys.stderr)
        return 2
    sub = _SUBCOMMANDS[name]
    before = set(_defined_flags())
    sub.define()
    flag_args, command = split_args(args[1:])
    wanted = help_request(flag_args)
    if wanted:
        own = [flag for flag_name, flag in _defined_flags().items()
               if flag_name not in before]
        print(subcommand_help(name, own, full=wanted == "helpfull"))
        return 0
    see = f"(`{PROG} {name} --help` lists its flags)"
    try:
        if name in _JOBS:
            flag_args = _elasticdl_args(flag_args)
    except UsageError as e:
        print(f"{PROG} {name}: {e}", file=sys.stderr)
        return 2
    try:
        unparsed = FLAGS([f"{PROG} {name}", *flag_args])
    except flags.Error as e:
        print(f"{PROG} {name}: {e}\n{see}", file=sys.stderr)
        return 2
    if len(unparsed) > 1:
        where = ("put the worker command after `--`" if "-- COMMAND" in sub.usage
                 else f"`{PROG} {name}` takes flags only")
        print(f"{PROG} {name}: unexpected arguments {unparsed[1:]}; {where} {see}",
              file=sys.stderr)
        return 2
    logging.use_absl_handler()
    level = (getattr(FLAGS, "log_level", None) or "info").lower() if name in _JOBS else (
        "info")
    logging.set_verbosity("fatal" if level == "critical" else level)
    try:
        return sub.main(command)
    except UsageError as e:
        print(f"{PROG} {name}: {e}", file=sys.stderr)
        return 2


def run_main() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv))


if __name__ == "__main__":
    run_main()
