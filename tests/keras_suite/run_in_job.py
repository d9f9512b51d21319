"""The command every worker of a job runs for Keras' tests in a job
(tests/test_keras_suite_job.py): pytest over the given tests of this suite,
with `KE_KERAS_SUITE_JOB=1` (conftest.py keeps the job's cluster), then exit 0
whatever the tests' outcome: the outcome is the record (`KE_KERAS_SUITE_RECORD`,
one per worker), and a worker that exits with an error would be relaunched to
run every test again.

Usage: `keras-elastic run ... -- python tests/keras_suite/run_in_job.py TESTS...`
"""

import os
import sys

import pytest

if __name__ == "__main__":
    os.environ["KE_KERAS_SUITE_JOB"] = "1"
    code = pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]])
    print(f"pytest exit code {int(code)}", flush=True)
    sys.exit(0)
