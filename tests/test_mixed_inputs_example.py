"""Per-component batching in the elastic pipeline: dense, padded and sparse
inputs of one Keras model (examples/mixed_inputs)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, subprocess_env

import keras_elastic as ke
import keras_elastic.batching as kb


@pytest.mark.multiprocess
def test_mixed_input_model_trains_through_fit(tmp_path):
    out = tmp_path / "history.json"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "mixed_inputs", "train.py"),
         "--epochs=3", "--num_records=2048", f"--data_dir={tmp_path / 'data'}",
         f"--output={out}"], env=subprocess_env(), capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads(out.read_text())
    assert history["accuracy"][-1] > 0.85, history  # learnt from all three inputs
    assert history["loss"][-1] < history["loss"][0]


def test_batching_argument_errors():
    data = {"a": np.ones((4, 1), "float32")}
    with pytest.raises(TypeError, match="takes keras_elastic.batching reducers"):
        ke.ElasticDataset(data, batching=lambda ds: ds.batch(2))
    with pytest.raises(ValueError, match="batch_size=8 but batching=Batching\\(4"):
        ke.ElasticDataset(data, batch_size=8, batching=kb.Batching(4))
