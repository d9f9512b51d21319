"""The dependency rules of the packages, checked (issue 24).

The rules are written once, as data: `ALLOWED` below. This test checks every
import of the library against them, the imports inside functions included (a
lazy import is still a dependency); that no modules import each other in a
circle; that BUILD's deps follow them; that docs/architecture.md's table of
them is generated from them (`python tests/test_architecture.py` rewrites
it); and that the roles that must start without TensorFlow do.

The layers, lowest first (a package imports only packages listed for it):

    proto
    common, _backend                      (shared pieces; keras_compat)
    data, batching, prediction, layers    (no cluster)
    checkpoint                            (sharded checkpoints)
    master, ps                            (the services and their clients)
    launcher, dataset                     (processes; the user's dataset)
    worker                                (a model's link to the cluster)
    model                                 (ke.Model, ke.wrap)
    callbacks                             (what a script adds to fit)
    jobs, cli, __init__, __main__         (entry points, the public API)
"""

from __future__ import annotations

import ast
import collections
import os
import re
import subprocess
import sys

import pytest
from conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ALLOWED: dict[str, set[str]] = {
    "proto": set(),
    "common": {"proto"},
    "_backend": set(),
    "data": {"common"},
    "batching": {"common"},
    "prediction": {"common"},
    "layers": {"common"},
    "checkpoint": {"common", "layers"},
    "master": {"common", "proto"},
    "ps": {"common", "proto", "checkpoint"},
    "launcher": {"common", "proto", "master", "ps", "checkpoint"},
    "dataset": {"common", "proto", "_backend", "data", "batching", "master"},
    "worker": {"common", "proto", "data", "batching", "prediction", "layers",
               "checkpoint", "master", "ps", "dataset"},
    "model": {"common", "_backend", "data", "layers", "prediction", "checkpoint",
              "dataset", "worker"},
    "callbacks": {"common", "checkpoint", "dataset", "worker", "model"},
    # The public API (`import keras_elastic as ke` imports the rest lazily).
    "jobs": {"__init__", "common", "prediction", "checkpoint", "callbacks", "model",
             "dataset"},
    "cli": {"common", "jobs", "launcher", "master"},
    "__init__": {"common"},
    "__main__": {"cli"},
}

# Modules of roles that start without TensorFlow (the launcher checks a job's
# flags and the master hands out tasks on machines that may not have it).
WITHOUT_TENSORFLOW = ["keras_elastic.master.server", "keras_elastic.launcher.launcher",
                      "keras_elastic.launcher.recovery",
                      "keras_elastic.launcher.services",
                      "keras_elastic.launcher.worker_group",
                      "keras_elastic.jobs.model_def", "keras_elastic.jobs.job_flags",
                      "keras_elastic.ps.client", "keras_elastic.cli"]


def modules() -> dict[str, str]:
    """{module name: path} of the library (generated protobuf code aside)."""
    found = {}
    for folder, _, names in os.walk(os.path.join(ROOT, "keras_elastic")):
        for name in names:
            if name.endswith(".py") and "_pb2" not in name:
                path = os.path.join(folder, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def imports(path: str) -> list[tuple[str, int]]:
    """(module imported, line) for every keras_elastic import in `path`."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or "").startswith("keras_elastic"):
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names
                      if a.name.startswith("keras_elastic")]
    return found


def resolve(name: str, known: dict[str, str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph() -> dict[str, set[tuple[str, int]]]:
    known = modules()
    edges: dict[str, set[tuple[str, int]]] = collections.defaultdict(set)
    for module, path in known.items():
        for name, line in imports(path):
            target = resolve(name, known)
            # A module importing its own package (its __init__) is not an edge.
            if target and target != module and not module.startswith(target + "."):
                edges[module].add((target, line))
    return edges


def test_every_package_is_in_a_layer():
    units = {unit(m) for m in modules()}
    assert units == set(ALLOWED), (
        f"packages without a rule: {sorted(units - set(ALLOWED))}; rules without a "
        f"package: {sorted(set(ALLOWED) - units)}")


def test_each_package_imports_only_what_its_layer_allows():
    known = modules()
    wrong = []
    for module, targets in graph().items():
        for target, line in targets:
            a, b = unit(module), unit(target)
            if a != b and b not in ALLOWED[a]:
                wrong.append(f"{os.path.relpath(known[module], ROOT)}:{line} imports "
                             f"{target} ({a} may import {sorted(ALLOWED[a])})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_rules_allow_no_circle_between_packages():
    # The rules themselves: a package never reaches back to itself.
    def reach(start: str) -> set[str]:
        seen, todo = set(), list(ALLOWED[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo += ALLOWED[node]
        return seen

    assert [u for u in ALLOWED if u in reach(u)] == []


def test_no_modules_import_each_other_in_a_circle():
    edges = {m: {t for t, _ in ts} for m, ts in graph().items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in modules():
        if module not in index:
            visit(module)
    assert circles == []


# -- BUILD's deps ---------------------------------------------------------------
def build_libraries(text: str) -> dict[str, tuple[set[str], list[str], int]]:
    """{target: (the packages of its modules, its deps, line)} of the
    ke_library and py_library calls with sources of keras_elastic/ in BUILD
    (`text`); a library without sources (the whole library) imports nothing."""
    found = {}
    for node in ast.walk(ast.parse(text, "BUILD")):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
                node.func.id in ("ke_library", "py_library")):
            continue
        args = {k.arg: k.value for k in node.keywords}
        name = ast.literal_eval(args["name"])
        deps = [d.removeprefix(":") for d in ast.literal_eval(args.get("deps",
                                                                        ast.List([])))]
        package = ast.literal_eval(args["package_dir"]) if "package_dir" in args else ""
        try:
            srcs = ast.literal_eval(args["srcs"]) if "srcs" in args else None
        except ValueError:  # computed (proto's generated modules): package_dir's
            srcs = None
        if srcs is not None:
            files = [s for s in srcs if s.startswith("keras_elastic/")]
        elif package.startswith("keras_elastic/"):
            files = [f"{package}/__init__.py"]
        else:
            files = []  # no sources, or not keras_elastic's (the callbacks/ folder)
        if files:
            packages = {unit(f.removesuffix(".py").replace("/", ".")) for f in files}
            found[name] = (packages, deps, node.lineno)
    return found


def build_problems(text: str) -> list[str]:
    """Where BUILD's deps (`text`) disagree with ALLOWED: a dep on a package
    ALLOWED forbids, an import of the code without its dep, a package
    without a library."""
    libraries = build_libraries(text)
    owner = {p: name for name, (packages, _, _) in libraries.items()
             for p in packages}
    problems = [f"BUILD: no library holds keras_elastic's {p}"
                for p in sorted(set(ALLOWED) - set(owner))]
    for name, (packages, deps, line) in sorted(libraries.items()):
        allowed = packages.union(*(ALLOWED[p] for p in packages))
        for dep in deps:
            # Every library needs its parent package (keras_elastic/__init__.py).
            if dep != "package_root" and dep in libraries:
                forbidden = libraries[dep][0] - allowed
                if forbidden:
                    problems.append(
                        f"BUILD:{line} :{name} depends on :{dep}, but "
                        f"{'/'.join(sorted(packages))} may not import "
                        f"{'/'.join(sorted(forbidden))} (ALLOWED: {sorted(allowed)})")
    missing: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for module, targets in graph().items():
        # keras_elastic/__init__.py imports common, which needs it: a circle
        # Bazel cannot declare (:package_root has no deps).
        if unit(module) == "__init__" or unit(module) not in owner:
            continue
        library = owner[unit(module)]
        for target, line in targets:
            need = owner.get(unit(target))
            if need and need != library and need not in libraries[library][1]:
                missing[library, need].append(f"{module}:{line} imports {target}")
    for (library, need), where in sorted(missing.items()):
        problems.append(f"BUILD:{libraries[library][2]} :{library} lacks the dep "
                        f":{need} ({'; '.join(sorted(where)[:3])})")
    return problems


def test_build_deps_follow_the_import_rules():
    """BUILD's deps between keras_elastic's libraries are checked against
    ALLOWED (the one place the rules are written) and the code's imports."""
    problems = build_problems(open(os.path.join(ROOT, "BUILD")).read())
    assert not problems, "\n".join(problems)


def test_the_build_check_sees_a_wrong_or_missing_dep():
    assert "ps" not in ALLOWED["master"] and "checkpoint" in ALLOWED["ps"]
    text = open(os.path.join(ROOT, "BUILD")).read()
    assert '        ":checkpoint",\n' in text.split('name = "ps"')[1].split(")")[0]
    master = text.index('name = "master"')
    wrong = text[:master] + text[master:].replace('":common",', '":ps", ":common",', 1)
    assert any(":master depends on :ps" in p for p in build_problems(wrong))
    ps = text.index('name = "ps"')
    lacking = text[:ps] + text[ps:].replace('":checkpoint",', "", 1)
    assert any(":ps lacks the dep :checkpoint" in p for p in build_problems(lacking))


# -- docs/architecture.md's table of the rules ----------------------------------
DOCS = os.path.join(ROOT, "docs", "architecture.md")
RULES_BEGIN = "<!-- import rules: generated, do not edit -->\n"
RULES_END = "<!-- end of import rules -->"


def rules_table() -> str:
    """ALLOWED as docs/architecture.md shows it: a row per package, lowest first."""
    def shown(name: str) -> str:
        is_package = os.path.isdir(os.path.join(ROOT, "keras_elastic", name))
        return f"`{name}/`" if is_package else f"`{name}.py`"

    order = list(ALLOWED)
    rows = [f"| {shown(name)} | "
            f"{', '.join(shown(a) for a in sorted(allowed, key=order.index)) or '-'} |"
            for name, allowed in ALLOWED.items()]
    return "\n".join(["| package | may import |", "| --- | --- |", *rows]) + "\n"


def with_rules_table(text: str) -> str:
    """docs/architecture.md's `text` with its table of rules made from ALLOWED."""
    head, rest = text.split(RULES_BEGIN)
    return head + RULES_BEGIN + rules_table() + RULES_END + rest.split(RULES_END)[1]


def test_the_docs_list_the_import_rules():
    text = open(DOCS).read()
    assert text == with_rules_table(text), (
        "docs/architecture.md's table of import rules differs from ALLOWED: "
        "run `python tests/test_architecture.py` to rewrite it")


def may_import(docstring: str) -> set[str] | None:
    """The packages a package's docstring says it may import: the sentence
    "May import: a, b, c." ("keras_elastic (the public API)": its
    `__init__`; "nothing": none); None if it has none."""
    found = re.search(r"May import:([^.]*(?:\.[a-z_][^.]*)*)\.(?:\s|$)", docstring)
    if found is None:
        return None
    names = re.split(r",|\band\b", " ".join(found.group(1).split()))
    if [n.strip() for n in names] == ["nothing"]:
        return set()
    return {"__init__" if n.strip() == "keras_elastic (the public API)" else n.strip()
            for n in names if n.strip()}


def test_the_packages_docstrings_say_what_the_rules_say():
    """Each package's docstring's "May import:" sentence lists ALLOWED's
    packages for it (a copy a reader finds where the code is; checked here)."""
    checked, wrong = [], {}
    for package in sorted(ALLOWED):
        path = os.path.join(ROOT, "keras_elastic", package, "__init__.py")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            said = may_import(ast.get_docstring(ast.parse(f.read())) or "")
        assert said is not None, f"{path}: its docstring has no 'May import:' sentence"
        checked.append(package)
        if said != ALLOWED[package]:
            wrong[package] = (sorted(said), sorted(ALLOWED[package]))
    assert not wrong, f"docstring vs ALLOWED: {wrong}"
    assert len(checked) >= 13, checked


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The rules bite: an import from a lower layer to a higher one is found."""
    path = tmp_path / "bad.py"
    path.write_text("def f():\n    from keras_elastic.model import wrap\n")
    (target, line), = imports(str(path))
    assert (resolve(target, modules()), line) == ("keras_elastic.model", 2)
    assert "model" not in ALLOWED["worker"]


@pytest.mark.multiprocess
def test_roles_that_start_without_tensorflow_do():
    script = ("import importlib, sys\n"
              f"for name in {WITHOUT_TENSORFLOW!r}:\n"
              "    importlib.import_module(name)\n"
              "heavy = [m for m in ('tensorflow', 'keras') if m in sys.modules]\n"
              "print('LOADED', heavy)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, env=subprocess_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LOADED []" in out.stdout


if __name__ == "__main__":  # rewrites docs/architecture.md's table of rules
    with open(DOCS) as f:
        text = f.read()
    with open(DOCS, "w") as f:
        f.write(with_rules_table(text))
