"""Evaluation and prediction through the (embedded) cluster: exact results."""

import keras
import numpy as np
import pytest
from support.tfrecord_data import make_arrays

import keras_elastic as ke
from keras_elastic.prediction import PredictionWriter, read_predictions


def binary_model(cls=keras.Model, seed=2):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inputs)
    model = cls(inputs, keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc"),
                           keras.metrics.Precision(name="precision"),
                           keras.metrics.Recall(name="recall")])
    return model


def test_evaluate_equals_single_process_evaluate(embedded_cluster):
    x, y = make_arrays(1000)
    model = binary_model(ke.Model)
    model.fit(ke.ElasticDataset((x, y), batch_size=32), epochs=1, verbose=0)
    got = model.evaluate(ke.ElasticDataset((x, y), batch_size=64, minibatches_per_task=3,
                                           mode="evaluation", name="eval"),
                         return_dict=True, verbose=0)
    reference = binary_model()
    reference.set_weights(model.get_weights())
    expected = reference.evaluate(x, y, batch_size=64, return_dict=True, verbose=0)
    assert set(got) == set(expected) == {"loss", "accuracy", "auc", "precision",
                                         "recall"}
    for name in expected:
        assert got[name] == pytest.approx(expected[name], abs=1e-6), name


def test_fit_validation_runs_after_each_epoch_and_matches_evaluate(embedded_cluster):
    x, y = make_arrays(600)
    model = binary_model(ke.Model)
    history = model.fit(
        ke.ElasticDataset((x, y), batch_size=32), epochs=3, verbose=0, validation_freq=2,
        validation_data=ke.ElasticDataset((x[:200], y[:200]), batch_size=50,
                                          minibatches_per_task=1, mode="evaluation",
                                          name="val"))
    assert len(history.history["loss"]) == 3
    assert len(history.history["val_auc"]) == 1  # validation_freq=2: epoch 2 only
    reference = binary_model()
    reference.set_weights(model.get_weights())
    # A standalone evaluate of the final weights equals plain Keras.
    final = model.evaluate(ke.ElasticDataset((x[:200], y[:200]), batch_size=50,
                                             minibatches_per_task=1, mode="evaluation",
                                             name="val2"), return_dict=True, verbose=0)
    expected = reference.evaluate(x[:200], y[:200], batch_size=50, return_dict=True,
                                  verbose=0)
    for name in expected:
        assert final[name] == pytest.approx(expected[name], abs=1e-6)


def test_metric_with_non_additive_state_is_refused(embedded_cluster):
    class LastBatchMean(keras.metrics.Metric):
        def __init__(self):
            super().__init__(name="last_batch_mean")
            self.value = self.add_variable((), "zeros", aggregation="only_first_replica")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.value.assign(keras.ops.mean(y_pred))

        def result(self):
            return self.value

    x, y = make_arrays(64)
    model = ke.Model.__new__(ke.Model)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    model.__init__(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=[LastBatchMean()])
    with pytest.raises(ValueError, match="metric 'last_batch_mean' \\(LastBatchMean\\) "
                       "has a state variable .*aggregation='only_first_replica'"):
        model.evaluate(ke.ElasticDataset((x, y), batch_size=16, mode="evaluation"),
                       verbose=0)


def test_predict_writes_each_task_once_and_reads_back_in_order(tmp_path,
                                                               embedded_cluster):
    x, _ = make_arrays(500)
    model = binary_model(ke.Model)
    out = str(tmp_path / "preds")
    returned = model.predict(ke.ElasticDataset((x,), batch_size=32, minibatches_per_task=2,
                                               mode="prediction", output_dir=out),
                             verbose=0)
    assert returned is None  # written to files instead
    got = read_predictions(out)
    reference = binary_model()
    reference.set_weights(model.get_weights())
    np.testing.assert_allclose(got, reference.predict(x, verbose=0), atol=1e-6)
    assert len(list((tmp_path / "preds").glob("part-*.npz"))) == 8  # 500 / 64
    # Without output_dir, predict returns this worker's predictions.
    kept = model.predict(ke.ElasticDataset((x,), batch_size=32, mode="prediction",
                                           name="inline"), verbose=0)
    np.testing.assert_allclose(kept, got, atol=1e-6)


def test_custom_prediction_writer_and_filtered_tasks(embedded_cluster):
    x, _ = make_arrays(100)
    seen = {}

    class Collect(PredictionWriter):
        def write(self, task, outputs):
            seen[task.task_id] = (task.start, task.end,
                                  None if outputs is None else outputs.shape)

    x[20:40, 0] = 100.0  # the records of task 1

    def drop_large(records, mode):
        return records.filter(lambda xi: xi[0] < 50.0)

    model = binary_model(ke.Model)
    ds = ke.ElasticDataset((x,), dataset_fn=drop_large, batch_size=10,
                           minibatches_per_task=2, mode="prediction",
                           output_writer=Collect())
    model.predict(ds, verbose=0)
    assert seen == {0: (0, 20, (20, 1)), 1: (20, 40, None), 2: (40, 60, (20, 1)),
                    3: (60, 80, (20, 1)), 4: (80, 100, (20, 1))}


def test_read_predictions_reports_missing_parts(tmp_path, embedded_cluster):
    x, _ = make_arrays(60)
    model = binary_model(ke.Model)
    out = tmp_path / "preds"
    model.predict(ke.ElasticDataset((x,), batch_size=10, minibatches_per_task=2,
                                    mode="prediction", output_dir=str(out)), verbose=0)
    (out / "part-00000001.npz").unlink()
    with pytest.raises(ValueError, match=r"incomplete: no part for task\(s\) \[1\]"):
        read_predictions(str(out))
    with pytest.raises(ValueError, match=r"no part for task\(s\) \[1, 3\]"):
        read_predictions(str(out), num_tasks=4)


@pytest.mark.parametrize("call, message", [
    (lambda m, x, y: m.evaluate(ke.ElasticDataset((x, y))),
     "evaluate\\(\\) needs an ElasticDataset in 'evaluation' mode"),
    (lambda m, x, y: m.predict(ke.ElasticDataset((x, y), mode="evaluation")),
     "predict\\(\\) needs an ElasticDataset in 'prediction' mode"),
    (lambda m, x, y: ke.ElasticDataset((x, y), output_dir="/tmp/x"),
     "output_dir and output_writer only apply to mode='prediction'"),
    (lambda m, x, y: m.fit(ke.ElasticDataset((x, y)), validation_data=ke.ElasticDataset(
        (x, y), name="v")), "validation_data must be an ElasticDataset in 'evaluation'"),
    (lambda m, x, y: m.fit(ke.ElasticDataset((x, y)), validation_data=ke.ElasticDataset(
        (x, y), mode="evaluation", name="training")), "both named 'training'"),
])
def test_mode_errors(call, message, embedded_cluster):
    x, y = make_arrays(32)
    with pytest.raises(ValueError, match=message):
        call(binary_model(ke.Model), x, y)


def test_periodic_evaluation_every_n_model_versions(embedded_cluster):
    from keras_elastic.worker import cluster as cluster_mod

    x, y = make_arrays(640)
    train = ke.ElasticDataset((x, y), batch_size=32)
    plain = binary_model(ke.Model).fit(train, epochs=2, verbose=0).history
    cluster_mod.reset_cluster()  # a fresh job for the same training
    evaluator = ke.callbacks.PeriodicEvaluation(
        ke.ElasticDataset((x[:200], y[:200]), batch_size=50, minibatches_per_task=1,
                          mode="evaluation", name="periodic"),
        every_n_versions=8, verbose=0)
    history = binary_model(ke.Model).fit(train, epochs=2, verbose=0,
                                         callbacks=[evaluator]).history
    # 40 updates in all: rounds at versions 8, 16, 24, 32, 40.
    assert [(r, v) for r, v, _ in evaluator.history] == [
        (1, 8), (2, 16), (3, 24), (4, 32), (5, 40)]
    assert set(evaluator.history[0][2]) == {"loss", "accuracy", "auc", "precision",
                                            "recall"}
    # Evaluating in the middle of epochs changes neither the training nor its
    # metrics.
    for name in plain:
        np.testing.assert_allclose(history[name], plain[name], atol=1e-6)
    status = cluster_mod.get_cluster().master.status()["datasets"]["periodic"]
    assert status["tasks_done_total"] == 5 * 4


def test_periodic_evaluation_argument_errors():
    x, y = make_arrays(10)
    with pytest.raises(ValueError, match="needs an ElasticDataset in 'evaluation'"):
        ke.callbacks.PeriodicEvaluation(ke.ElasticDataset((x, y)), every_n_versions=3)
    with pytest.raises(ValueError, match="every_n_versions must be >= 1, got 0"):
        ke.callbacks.PeriodicEvaluation(ke.ElasticDataset((x, y), mode="evaluation"),
                                        every_n_versions=0)
