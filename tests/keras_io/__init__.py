"""keras-io example ports (issue 23): plain Keras scripts, their elastic twins
(the README's change only) and the harness that runs them
(tests/test_keras_io_*.py)."""
