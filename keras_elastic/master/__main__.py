"""`python -m keras_elastic.master`: the master as a process (the launcher's)."""

from absl import app

from keras_elastic.master.server import define_flags, main

if __name__ == "__main__":
    define_flags()
    app.run(main)
