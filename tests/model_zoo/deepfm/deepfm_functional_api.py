# ruff: noqa: I001, UP008  (ElasticDL model-zoo style, kept as ElasticDL writes it)
"""ElasticDL's model_zoo/deepfm_functional_api on small synthetic CTR data:
named outputs {"logits", "probs"}, a loss on the logits, per-output
eval_metrics_fn with AUC, a LearningRateScheduler callback, and ElasticDL's
optional custom_data_reader hook (its RecordIO reader imported at the top, as
ElasticDL's CTR modules do; keras-elastic never calls the hook). (Keras 3
functional models take keras.ops/layers, not tf ops on symbolic tensors.)"""

import tensorflow as tf
from tensorflow.keras.layers import Dense, Embedding, Flatten

from elasticdl.python.common.constants import Mode
from elasticdl.python.data.reader.recordio_reader import RecordIODataReader
from elasticdl.python.elasticdl.callbacks import LearningRateScheduler

ops = tf.keras.ops


def custom_model(input_dim=100, embedding_dim=4, input_length=10, fc_unit=8):
    inputs = tf.keras.Input(shape=(input_length,), name="feature")
    embeddings = Embedding(input_dim=input_dim, output_dim=embedding_dim)(inputs)

    emb_sum = ops.sum(embeddings, axis=1)
    emb_sum_square = ops.square(emb_sum)
    emb_square_sum = ops.sum(ops.square(embeddings), axis=1)
    second_order = ops.sum(0.5 * (emb_sum_square - emb_square_sum), axis=1)

    id_bias = Embedding(input_dim=input_dim, output_dim=1)(inputs)
    first_order = ops.sum(id_bias, axis=(1, 2))
    fm_output = first_order + second_order

    nn_h = Dense(fc_unit)(Flatten()(embeddings))
    deep_output = ops.reshape(Dense(1)(nn_h), (-1,))
    logits = fm_output + deep_output
    probs = ops.reshape(ops.sigmoid(logits), (-1, 1))

    return tf.keras.Model(
        inputs=inputs, outputs={"logits": logits, "probs": probs}
    )


def loss(labels, predictions):
    logits = predictions["logits"]
    labels = tf.cast(tf.reshape(labels, [-1]), tf.dtypes.float32)
    logits = tf.reshape(logits, [-1])
    return tf.reduce_mean(
        input_tensor=tf.nn.sigmoid_cross_entropy_with_logits(
            logits=logits, labels=labels
        )
    )


def optimizer(lr=0.1):
    return tf.optimizers.SGD(lr)


def feed(dataset, mode, _):
    def _parse_data(record):
        if mode == Mode.PREDICTION:
            feature_description = {
                "feature": tf.io.FixedLenFeature([10], tf.int64)
            }
        else:
            feature_description = {
                "feature": tf.io.FixedLenFeature([10], tf.int64),
                "label": tf.io.FixedLenFeature([1], tf.int64),
            }
        r = tf.io.parse_single_example(record, feature_description)
        features = {"feature": tf.cast(r["feature"], tf.float32)}
        if mode == Mode.PREDICTION:
            return features
        return features, tf.cast(r["label"], tf.int32)

    dataset = dataset.map(_parse_data)

    if mode == Mode.TRAINING:
        dataset = dataset.shuffle(buffer_size=1024)
    return dataset


def eval_metrics_fn():
    return {
        "logits": {
            "accuracy": lambda labels, predictions: tf.equal(
                tf.cast(tf.reshape(predictions, [-1]) > 0.0, tf.int32),
                tf.cast(tf.reshape(labels, [-1]), tf.int32),
            )
        },
        "probs": {"auc": tf.keras.metrics.AUC()},
    }


def callbacks():
    def _schedule(model_version):
        return 0.5 if model_version < 100 else 0.2

    learning_rate_scheduler = LearningRateScheduler(_schedule)
    return [learning_rate_scheduler]


def custom_data_reader(data_origin, records_per_task=None, **kwargs):
    return RecordIODataReader(data_dir=data_origin)
