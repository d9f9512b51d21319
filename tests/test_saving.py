"""What Keras saves of an elastic model is the plain model (issue 23.3).

`ke.wrap` changes no class, so every Keras saving path writes a file that
`keras.models.load_model` (or `load_weights`) reads in a process that never
imports keras_elastic, with the servers' values: `model.save`,
`keras.saving.save_model`, `keras.callbacks.ModelCheckpoint` (`.keras` and
`.weights.h5`) during an elastic fit, and `ke.checkpoint.export_keras`. And
`ke.wrap(keras.models.load_model(path))` trains on from the file.
"""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import subprocess_env

import keras_elastic as ke

# Loads saved files with Keras alone (one process for all of them), predicts,
# and checks that nothing imported keras_elastic.
LOADER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import keras
    x = np.load(sys.argv[1])
    out = {}
    for path, kind in json.loads(sys.argv[2]):
        if kind == "weights":
            keras.utils.set_random_seed(0)
            inputs = keras.Input((8,))
            h = keras.layers.Dense(16, activation="relu")(inputs)
            h = keras.layers.BatchNormalization()(h)
            model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))
            model.load_weights(path)
        else:
            model = keras.models.load_model(path)
        np.save(path + ".pred.npy", model.predict(x, verbose=0))
        out[path] = type(model).__name__
    print(json.dumps({"classes": out,
                      "keras_elastic": any(m.startswith("keras_elastic")
                                           for m in sys.modules)}))
""")


def build_plain():
    """The functional model of `build`, plain Keras, same initial weights."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))


def build(kind: str):
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(16, activation="relu"),
              keras.layers.BatchNormalization(),
              keras.layers.Dense(3, activation="softmax")]
    if kind == "sequential":
        model = ke.Sequential([keras.Input((8,)), *layers])
    else:
        inputs = keras.Input((8,))
        h = inputs
        for layer in layers:
            h = layer(h)
        model = (ke.Model(inputs, h) if kind == "ke_model"
                 else ke.wrap(keras.Model(inputs, h)))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def data(n=512):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    return x, y


def load_elsewhere(files: list[tuple[str, str]], x: np.ndarray, tmp_path):
    """{path: (predictions, class name)} of `files` ((path, "model" or
    "weights")) loaded in a fresh process that never imports keras_elastic."""
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "x.npy"),
                             json.dumps(files)], env=subprocess_env(), cwd=str(tmp_path),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert info["keras_elastic"] is False, "the loader imported keras_elastic"
    return {path: (np.load(path + ".pred.npy"), info["classes"][path])
            for path, _ in files}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["wrapped", "ke_model", "sequential"])
def test_every_saving_path_loads_without_keras_elastic(kind, tmp_path, monkeypatch,
                                                       embedded_cluster):
    x, y = data()
    model = build(kind)
    assert ke.model.is_elastic(model)
    monkeypatch.chdir(tmp_path)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint("ckpt.keras"),
        keras.callbacks.ModelCheckpoint("ckpt.weights.h5", save_weights_only=True)])
    expected = model.predict(x, verbose=0)
    model.save(tmp_path / "model.keras")
    keras.saving.save_model(model, tmp_path / "saved.keras")
    ke.checkpoint.export_keras(model, tmp_path / "export.keras")
    files = [(str(tmp_path / name), "model") for name in (
        "model.keras", "saved.keras", "export.keras", "ckpt.keras")]
    if kind != "sequential":
        files.append((str(tmp_path / "ckpt.weights.h5"), "weights"))
    for path, (predicted, class_name) in load_elsewhere(files, x, tmp_path).items():
        if not path.endswith(".h5"):
            assert class_name == ("Sequential" if kind == "sequential"
                                  else "Functional"), path
        np.testing.assert_allclose(predicted, expected, atol=1e-5, err_msg=path)


def test_a_saved_file_holds_the_servers_optimizer_state_and_trains_on(
        tmp_path, embedded_cluster):
    # Saved after one elastic epoch, the file has the servers' weights *and*
    # optimizer state (Adam's moments and step): one more epoch from it, in
    # plain Keras or wrapped again on a new cluster, is epoch 2 of plain Keras.
    x, y = data()
    reference = build_plain()
    reference.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)

    model = build("wrapped")
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "model.keras")
    ke.worker.reset_cluster()  # a new job

    plain = keras.models.load_model(tmp_path / "model.keras")
    plain.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    loaded = ke.wrap(keras.models.load_model(tmp_path / "model.keras"))
    loaded.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    for trained in (plain, loaded):
        for a, b in zip(reference.get_weights(), trained.get_weights()):
            np.testing.assert_allclose(a, b, atol=2e-5)
