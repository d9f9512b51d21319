#!/bin/sh
# Run by `bazel coverage` in place of Bazel's downloaded coverage tools.
echo "keras-elastic: 'bazel coverage' is not available: Bazel's coverage tools" \
     "(@remote_coverage_tools) are downloaded by upstream Bazel and this workspace" \
     "builds offline (see WORKSPACE). Measure coverage outside Bazel." >&2
exit 1
