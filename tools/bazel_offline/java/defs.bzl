"""@rules_java//java:defs.bzl for Bazel 4.2 offline: the native Java rules.

Bazel's own @bazel_tools//tools/jdk package (loaded while resolving the
toolchains of every py_binary/py_test) loads these.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_lite_proto_library = native.java_lite_proto_library
java_plugin = native.java_plugin
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
