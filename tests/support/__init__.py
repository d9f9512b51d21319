"""Helpers the test files import (`from support.tfrecord_data import ...`):
data writers, the counting job's launcher and checks, the benches' smoke runs.
Scripts run as processes or loaded as model definitions are in tests/scripts/."""
