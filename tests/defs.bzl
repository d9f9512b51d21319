"""`pytest_test`: one pytest file as one py_test target."""

_RUNNER = "//tests:pytest_runner.py"

def pytest_test(name, src, deps = [], data = [], args = [], tags = [], size = "medium", **kwargs):
    """A py_test that runs the pytest file `src` through //tests:pytest_runner.py.

    `bazel test //tests:NAME --test_arg=-k --test_arg=EXPR` passes pytest
    arguments on; pytest writes its JUnit XML where Bazel reads it.

    Args:
      name: the target name (tests/BUILD uses the file's path without `.py`).
      src: the test file, relative to the calling package.
      deps: the py_library targets the file imports (conftest.py, helpers).
      data: files the test reads.
      args: more pytest arguments.
      tags: Bazel tags (e.g. "multiprocess").
      size: Bazel's test size, which sets the timeout.
      **kwargs: passed to py_test.
    """
    native.py_test(
        name = name,
        srcs = [_RUNNER, src],
        main = _RUNNER,
        args = ["$(rootpath %s)" % src] + args,
        deps = deps,
        data = data,
        tags = tags,
        size = size,
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = 0,
        **kwargs
    )
