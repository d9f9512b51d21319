"""Keras' own test suites run against elastic models (issue 40 item 1).

See conftest.py (the plugin that makes every model elastic), expected.py (the
manifest of tests that do not pass, with reasons) and docs/keras_tests.md.
"""
