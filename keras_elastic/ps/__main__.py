"""`python -m keras_elastic.ps`: a parameter server as a process."""

from absl import app

from keras_elastic.ps.server import define_flags, main

if __name__ == "__main__":
    define_flags()
    app.run(main)
