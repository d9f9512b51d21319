"""Unit tests of the sharding-callback validation (no files written)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from keras_elastic.checkpoint import (
    CheckpointError,
    ShardingCallbackError,
    ValidatingShardingCallback,
    validate_shards,
)
from keras_elastic.checkpoint import validation as v
from keras_elastic.checkpoint.slices import first_overlap, parse_slice_spec

DESC = "Test policy."


def shardable(key, tensor, spec="", device=None):
    return tf.train.experimental.ShardableTensor(
        _tensor_save_spec=None, tensor=tensor, dtype=tensor.dtype,
        device=tf.DeviceSpec.from_string(device if device is not None
                                         else tensor.device),
        name=key, shape=tensor.shape, slice_spec=spec, checkpoint_key=key,
        trackable=None)


@pytest.fixture
def matrix():
    t = tf.reshape(tf.range(12, dtype=tf.float32), [4, 3])
    return t, [shardable("w", t), shardable("s", tf.constant(1, tf.int64))]


def expect_error(shards, tensors, rule, *fragments):
    with pytest.raises(ShardingCallbackError) as info:
        validate_shards(shards, tensors, DESC)
    message = str(info.value)
    assert info.value.rule == rule
    assert rule in message and DESC in message
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def test_reslicing_that_covers_each_tensor_exactly_once_passes(matrix):
    t, tensors = matrix
    s = tensors[1].tensor
    shards = [{"w": {"4 3 0,2:-": t[:2]}}, {"w": {"4 3 2,2:0,3": t[2:]}, "s": {"": s}}]
    layout = validate_shards(shards, tensors, DESC)
    assert layout == [[("w", "4 3 0,2:-")], [("w", "4 3 2,2:0,3"), ("s", "")]]


def test_column_and_row_cuts_mixed_pass(matrix):
    t, tensors = matrix
    shards = [{"w": {"4 3 0,4:0,1": t[:, :1], "4 3 0,1:1,2": t[:1, 1:]}},
              {"w": {"4 3 1,3:1,2": t[1:, 1:]}, "s": {"": tensors[1].tensor}}]
    assert len(validate_shards(shards, tensors, DESC)) == 2


def test_dropped_tensor_is_named(matrix):
    t, tensors = matrix
    err = expect_error([{"w": {"": t}}], tensors, v.RULE_REMOVED,
                       "tensor 's'", "missing from every shard")
    assert err.checkpoint_key == "s" and err.description == DESC


def test_partly_dropped_tensor(matrix):
    t, tensors = matrix
    expect_error([{"w": {"4 3 0,2:-": t[:2]}, "s": {"": tensors[1].tensor}}],
                 tensors, v.RULE_REMOVED, "its slices hold only 6 of its 12 elements")


def test_none_value_counts_as_missing(matrix):
    t, tensors = matrix
    expect_error([{"w": {"": t}, "s": {"": None}}], tensors, v.RULE_REMOVED,
                 "tensor 's'")


def test_overlapping_slices(matrix):
    t, tensors = matrix
    expect_error([{"w": {"4 3 0,3:-": t[:3]}}, {"w": {"4 3 2,2:-": t[2:]},
                                                "s": {"": tensors[1].tensor}}],
                 tensors, v.RULE_RESHAPED, "overlap in 3 elements")


def test_added_key(matrix):
    t, tensors = matrix
    expect_error([{"w": {"": t}, "s": {"": tensors[1].tensor},
                   "extra": {"": t}}], tensors, v.RULE_ADDED, "tensor 'extra'")


def test_slice_outside_what_the_saver_gave():
    full = tf.zeros([4, 3])
    part = full[:2]
    tensors = [shardable("w", part, spec="4 3 0,2:-")]
    expect_error([{"w": {"4 3 0,3:-": full[:3]}}], tensors, v.RULE_ADDED,
                 "3 elements outside")


def test_reshaped_tensor(matrix):
    t, tensors = matrix
    expect_error([{"w": {"": tf.reshape(t, [-1])}, "s": {"": tensors[1].tensor}}],
                 tensors, v.RULE_RESHAPED, "tensor 'w'", "shape [12]",
                 "needs shape [4, 3]")


def test_declared_full_shape_changed(matrix):
    t, tensors = matrix
    expect_error([{"w": {"12 0,12": tf.reshape(t, [-1])},
                   "s": {"": tensors[1].tensor}}],
                 tensors, v.RULE_RESHAPED, "declares the full shape [12]")


def test_dtype_change(matrix):
    t, tensors = matrix
    expect_error([{"w": {"": tf.cast(t, tf.float16)}, "s": {"": tensors[1].tensor}}],
                 tensors, v.RULE_DTYPE, "tensor 'w'", "float16", "float32")


def test_bad_slice_spec(matrix):
    t, tensors = matrix
    expect_error([{"w": {"4 3 0,2": t}, "s": {"": tensors[1].tensor}}],
                 tensors, v.RULE_RESHAPED, "1 slice dimensions for a tensor of rank 2")


@pytest.mark.parametrize("shards, fragment", [
    ({"w": {}}, "returned a dict, not a list of shard dicts"),
    (None, "returned a NoneType"),
    ([["w"]], "shard 0 is a list, not a dict"),
    ([{"w": "x"}], "maps it to a str"),
    ([{"w": {"": 3.0}}], "holds a float instead of a tensor"),
    ([{"w": {7: tf.zeros([4, 3])}}], "slice spec 7 (int) is not a string"),
])
def test_malformed_output(matrix, shards, fragment):
    _, tensors = matrix
    expect_error(shards, tensors, v.RULE_OUTPUT, fragment)


def test_task_rules_with_tensors_on_two_tasks():
    with tf.Graph().as_default():
        with tf.device("/job:worker/task:0"):
            a = tf.zeros([2])
        with tf.device("/job:worker/task:1"):
            b = tf.ones([2])
            a_moved = tf.identity(a)
        tensors = [shardable("a", a), shardable("b", b)]
        assert len(validate_shards([{"a": {"": a}}, {"b": {"": b}}], tensors,
                                   DESC)) == 2
        expect_error([{"a": {"": a}, "b": {"": b}}], tensors, v.RULE_TASK,
                     "tensor 'b'", "mixes task /job:worker/task:1 with task "
                     "/job:worker/task:0 (of tensor 'a')")
        expect_error([{"a": {"": a_moved}}, {"b": {"": b}}], tensors, v.RULE_TASK,
                     "tensor 'a'", "holds it on task /job:worker/task:1; it "
                     "belongs to task /job:worker/task:0")


def test_parse_slice_spec():
    assert parse_slice_spec("", (2, 3)).shape == (2, 3)
    box = parse_slice_spec("5 7 1,2:-", (5, 7))
    assert (box.offset, box.shape, box.volume) == ((1, 0), (2, 7), 14)
    assert parse_slice_spec("", ()).volume == 1
    with pytest.raises(ValueError, match="has no full shape"):
        parse_slice_spec("0,2", (4,))
    with pytest.raises(ValueError, match=r"covers \[3, 6\), outside \[0, 4\)"):
        parse_slice_spec("4 3,3", (4,))
    with pytest.raises(ValueError, match="expected '<start>,<length>' or '-'"):
        parse_slice_spec("4 x", (4,))
    with pytest.raises(ValueError, match="not a list of integers"):
        parse_slice_spec("4 a 0,1:0,1", (4,))


def test_first_overlap_sweeps_many_slices():
    boxes = [parse_slice_spec(f"1000 {i},1", (1000,)) for i in range(1000)]
    assert first_overlap(boxes) is None
    boxes.append(parse_slice_spec("1000 500,2", (1000,)))
    assert first_overlap(boxes) in {(500, 1000), (501, 1000)}


def test_check_sharding_callback_wants_an_instance():
    with pytest.raises(TypeError, match=r"is the class ShardByTaskPolicy; pass an "
                       r"instance, e\.g\. ShardByTaskPolicy\(\.\.\.\)"):
        ValidatingShardingCallback(tf.train.experimental.ShardByTaskPolicy)
    with pytest.raises(TypeError, match="must be a tf.train.experimental."
                       "ShardingCallback instance, got function"):
        ValidatingShardingCallback(lambda tensors: [tensors])


def test_max_shard_size_too_small_for_any_slice_is_refused():
    policy = ValidatingShardingCallback(
        tf.train.experimental.MaxShardSizePolicy(max_shard_size=200))
    kernel = tf.zeros([64, 64])
    with pytest.raises(CheckpointError, match=(
            r"MaxShardSizePolicy\(max_shard_size=200\) cannot split tensor 'k' "
            r"of shape \[64, 64\] \(float32\): its thinnest slice is 256 bytes.*"
            r"Use max_shard_size >= 256")):
        policy([shardable("k", kernel)])
    ok = ValidatingShardingCallback(
        tf.train.experimental.MaxShardSizePolicy(max_shard_size=256))
    assert len(ok([shardable("k", kernel)])) == 64


class _DropAll(tf.train.experimental.ShardingCallback):
    description = "Drops everything."

    def __call__(self, shardable_tensors):
        return [{}]


def test_error_is_kept_and_after_call_runs_either_way(matrix):
    _, tensors = matrix
    calls = []
    broken = ValidatingShardingCallback(_DropAll(), after_call=lambda: calls.append(1))
    with pytest.raises(ShardingCallbackError, match="Drops everything") as err:
        broken(tensors)
    assert broken.error is err.value and broken.layout == []
    assert calls == [1]
    fine = ValidatingShardingCallback(tf.train.experimental.ShardByTaskPolicy(),
                                      after_call=lambda: calls.append(2))
    shards = fine(tensors)
    assert fine.error is None and calls == [1, 2]
    assert fine.layout == validate_shards(shards, tensors, "by task") == [
        [("w", ""), ("s", "")]]
    assert fine.callback_seconds > 0 and fine.validation_seconds > 0
