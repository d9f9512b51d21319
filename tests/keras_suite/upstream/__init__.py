"""Copies of Keras test modules that cannot run unchanged (see
tests/keras_suite/test_upstream_diffs.py: each has its diff committed beside it)."""
