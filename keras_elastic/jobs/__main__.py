"""`python -m keras_elastic.jobs`: one worker of a train/evaluate/predict job."""

from absl import app

from keras_elastic.jobs.runner import define_flags, main

if __name__ == "__main__":
    define_flags()
    app.run(main)
