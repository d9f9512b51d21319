"""`python -m keras_elastic` is the `keras-elastic` command."""

from keras_elastic.cli import run_main

run_main()
