"""Scripts the tests run as processes (`keras-elastic run -- python
tests/scripts/X.py`) or load as model definitions (`--model_zoo=tests/scripts
--model_def=cli_model_def:custom_model`); they import tests/support/ by putting
tests/ on `sys.path`."""
