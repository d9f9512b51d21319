"""Checks a sharding callback's shards before anything is written.

TensorFlow 2.21 calls the `experimental_sharding_callback` of
`tf.train.CheckpointOptions` but never validates what it returns
(`sharding_util.validate_shards` exists and is never called, and it would
reject the re-slicing that `MaxShardSizePolicy` does). A callback that drops
a tensor silently writes a checkpoint that cannot be restored.
`ValidatingShardingCallback` wraps any callback, runs it, checks its shards
against the RFC's rules and only then hands them to TensorFlow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from keras_elastic.checkpoint.errors import CheckpointError, ShardingCallbackError
from keras_elastic.checkpoint.slices import Box, first_overlap, parse_slice_spec

ShardingCallback = tf.train.experimental.ShardingCallback
ShardableTensor = tf.train.experimental.ShardableTensor

RULE_OUTPUT = ("the callback must return a sequence of shards, each a dict "
               "{checkpoint_key: {slice_spec: tensor}}")
RULE_REMOVED = "tensors must not be removed"
RULE_ADDED = "tensors must not be added"
RULE_RESHAPED = ("tensors must not be reshaped (re-slicing is allowed, but the "
                 "slices must cover each tensor exactly once)")
RULE_DTYPE = "tensor dtypes must not change"
RULE_TASK = "tensors within a shard must belong to the same task"


def _task_of(device: Any) -> tuple[str | None, int | None]:
    """(job, task) of a device string or `tf.DeviceSpec`; parts may be None."""
    if device is None:
        return (None, None)
    if not isinstance(device, tf.DeviceSpec):
        device = tf.DeviceSpec.from_string(str(device or ""))
    return (device.job, device.task)


def _same_task(a: tuple[str | None, int | None],
               b: tuple[str | None, int | None]) -> bool:
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def _format_task(task: tuple[str | None, int | None]) -> str:
    job, index = task
    return f"/job:{job or '?'}/task:{'?' if index is None else index}"


def _spec_string(spec: Any, key: str, description: str) -> str:
    if isinstance(spec, str):
        return spec.strip()
    if isinstance(spec, bytes):
        return spec.decode().strip()
    if isinstance(spec, tf.Variable.SaveSliceInfo):
        return spec.spec.strip()
    if isinstance(spec, tf.Tensor) and tf.executing_eagerly():
        return spec.numpy().decode().strip()
    raise ShardingCallbackError(
        key, RULE_OUTPUT, description,
        f"slice spec {spec!r} ({type(spec).__name__}) is not a string")


class _Original:
    """What the saver handed to the callback for one checkpoint key."""

    def __init__(self, dtype: tf.DType, task: tuple[str | None, int | None]):
        self.dtype = dtype
        self.task = task
        self.boxes: list[Box] = []


def _originals(shardable_tensors: Sequence[ShardableTensor],
               description: str) -> dict[str, _Original]:
    originals: dict[str, _Original] = {}
    for st in shardable_tensors:
        key = st.checkpoint_key
        shape = tf.TensorShape(st.shape)
        if not shape.is_fully_defined():
            raise ShardingCallbackError(
                key, RULE_OUTPUT, description,
                f"the saver gave a tensor of unknown shape {shape}; its slices "
                "cannot be checked")
        entry = originals.setdefault(
            key, _Original(tf.as_dtype(st.dtype), _task_of(st.device)))
        spec = st.slice_spec or ""
        if isinstance(spec, tf.Variable.SaveSliceInfo):
            spec = spec.spec
        box = parse_slice_spec(spec, shape.as_list())
        if spec.strip() and tuple(shape.as_list()) != box.shape:
            raise ShardingCallbackError(
                key, RULE_OUTPUT, description,
                f"the saver gave a tensor of shape {shape.as_list()} for slice "
                f"{box.describe()}")
        entry.boxes.append(box)
    return originals


def validate_shards(
    shards: Any,
    shardable_tensors: Sequence[ShardableTensor],
    description: str,
) -> list[list[tuple[str, str]]]:
    """Checks a sharding callback's output against the sharding rules.

    Unlike TensorFlow's `sharding_util.validate_shards`, re-slicing is allowed:
    the slices of each tensor must lie inside it and cover it exactly once.

    Args:
        shards: What the callback returned: a sequence of shards, each a dict
            `{checkpoint_key: {slice_spec: tensor}}`.
        shardable_tensors: The `tf.train.experimental.ShardableTensor`s the
            callback was called with.
        description: The callback's description, used in error messages.

    Returns:
        For each shard, the `(checkpoint_key, slice_spec)` pairs it holds.

    Raises:
        ShardingCallbackError: If a tensor was removed, added, reshaped, had
            its dtype changed, or a shard mixes tasks. The message names the
            checkpoint key, the rule and the callback's description.

    Example:

    ```python
    import tensorflow as tf
    from keras_elastic.checkpoint import validate_shards

    v = tf.Variable(tf.zeros([4, 2]))
    st = tf.train.experimental.ShardableTensor(
        _tensor_save_spec=None, tensor=v.read_value(), dtype=v.dtype,
        device=tf.DeviceSpec.from_string(v.device), name="v", shape=v.shape,
        slice_spec="", checkpoint_key="v", trackable=None)
    top, bottom = v.read_value()[:2], v.read_value()[2:]
    layout = validate_shards(
        [{"v": {"4 2 0,2:-": top}}, {"v": {"4 2 2,2:-": bottom}}],
        [st], "Two halves.")
    print(layout)  # [[('v', '4 2 0,2:-')], [('v', '4 2 2,2:-')]]
    ```
    """
    originals = _originals(shardable_tensors, description)
    if isinstance(shards, Mapping) or not isinstance(shards, Sequence):
        raise ShardingCallbackError(
            None, RULE_OUTPUT, description,
            f"it returned a {type(shards).__name__}, not a list of shard dicts")
    written: dict[str, list[tuple[Box, int, str]]] = {}
    layout: list[list[tuple[str, str]]] = []
    for shard_index, shard in enumerate(shards):
        if not isinstance(shard, Mapping):
            raise ShardingCallbackError(
                None, RULE_OUTPUT, description,
                f"shard {shard_index} is a {type(shard).__name__}, not a dict")
        shard_task: tuple[str | None, int | None] = (None, None)
        shard_task_key = None
        entries: list[tuple[str, str]] = []
        for key, slices in shard.items():
            if not isinstance(slices, Mapping):
                raise ShardingCallbackError(
                    key, RULE_OUTPUT, description,
                    f"shard {shard_index} maps it to a {type(slices).__name__}"
                    ", not a dict {slice_spec: tensor}")
            original = originals.get(key)
            if original is None:
                raise ShardingCallbackError(
                    key, RULE_ADDED, description,
                    f"shard {shard_index} holds a checkpoint key that the "
                    "saver did not give to the callback")
            full_shape = original.boxes[0].full_shape
            for raw_spec, tensor in slices.items():
                spec = _spec_string(raw_spec, key, description)
                if tensor is None:
                    continue  # An empty slot: counted as missing below.
                if not (hasattr(tensor, "dtype") and hasattr(tensor, "shape")):
                    raise ShardingCallbackError(
                        key, RULE_OUTPUT, description,
                        f"shard {shard_index} holds a {type(tensor).__name__} "
                        "instead of a tensor")
                try:
                    box = parse_slice_spec(spec, full_shape)
                except ValueError as e:
                    raise ShardingCallbackError(
                        key, RULE_RESHAPED, description,
                        f"shard {shard_index}: {e}") from e
                if box.full_shape != full_shape:
                    raise ShardingCallbackError(
                        key, RULE_RESHAPED, description,
                        f"shard {shard_index} declares the full shape "
                        f"{list(box.full_shape)} (slice spec {spec!r}); the "
                        f"tensor's shape is {list(full_shape)}")
                shape = tf.TensorShape(tensor.shape)
                if not shape.is_compatible_with(box.shape) or (
                        shape.rank is not None and shape.rank != len(box.shape)):
                    raise ShardingCallbackError(
                        key, RULE_RESHAPED, description,
                        f"shard {shard_index} holds a tensor of shape "
                        f"{shape.as_list() if shape.rank is not None else '?'}"
                        f" for slice {box.describe()} (slice spec {spec!r}), "
                        f"which needs shape {list(box.shape)}")
                dtype = tf.as_dtype(tensor.dtype)
                if dtype != original.dtype:
                    raise ShardingCallbackError(
                        key, RULE_DTYPE, description,
                        f"shard {shard_index} holds it as {dtype.name}; it was "
                        f"{original.dtype.name}")
                task = _task_of(getattr(tensor, "device", None))
                if not _same_task(task, original.task):
                    raise ShardingCallbackError(
                        key, RULE_TASK, description,
                        f"shard {shard_index} holds it on task "
                        f"{_format_task(task)}; it belongs to task "
                        f"{_format_task(original.task)}")
                if not _same_task(task, shard_task):
                    raise ShardingCallbackError(
                        key, RULE_TASK, description,
                        f"shard {shard_index} mixes task {_format_task(task)} "
                        f"with task {_format_task(shard_task)} (of tensor "
                        f"'{shard_task_key}')")
                if shard_task_key is None or shard_task == (None, None):
                    shard_task, shard_task_key = task, key
                written.setdefault(key, []).append((box, shard_index, spec))
                entries.append((key, spec))
        layout.append(entries)

    for key, original in originals.items():
        pieces = written.get(key)
        if not pieces:
            raise ShardingCallbackError(
                key, RULE_REMOVED, description,
                "it is missing from every shard")
        boxes = [box for box, _, _ in pieces]
        clash = first_overlap(boxes)
        if clash is not None:
            (a, sa, spec_a), (b, sb, spec_b) = pieces[clash[0]], pieces[clash[1]]
            raise ShardingCallbackError(
                key, RULE_RESHAPED, description,
                f"slice {spec_a!r} (shard {sa}) and slice {spec_b!r} (shard "
                f"{sb}) overlap in {a.overlap(b)} elements")
        for box, shard_index, spec in pieces:
            inside = sum(box.overlap(o) for o in original.boxes)
            if inside != box.volume:
                raise ShardingCallbackError(
                    key, RULE_ADDED, description,
                    f"slice {spec!r} (shard {shard_index}) has "
                    f"{box.volume - inside} elements outside the slices the "
                    f"saver gave: {[o.describe() for o in original.boxes]}")
        have = sum(box.volume for box in boxes)
        want = sum(o.volume for o in original.boxes)
        if have != want:
            raise ShardingCallbackError(
                key, RULE_REMOVED, description,
                f"its slices hold only {have} of its {want} elements")
    return layout


def check_max_shard_size(policy: ShardingCallback,
                         shardable_tensors: Sequence[ShardableTensor]) -> None:
    """Rejects a `MaxShardSizePolicy` too small to split some tensor.

    TensorFlow 2.21's `MaxShardSizePolicy` cuts a tensor into slices one index
    thick along some axis; when even the thinnest such slice is larger than
    `max_shard_size` (say a 64x64 float32 kernel, 256 bytes per row or column,
    with `max_shard_size=200`) it loops forever, allocating empty shards.

    Raises:
        CheckpointError: Naming the tensor, its shape and the smallest
            `max_shard_size` that works.

    Example:

    ```python
    import tensorflow as tf
    from keras_elastic.checkpoint.validation import check_max_shard_size

    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=1024)
    check_max_shard_size(policy, [])
    ```
    """
    if not isinstance(policy, tf.train.experimental.MaxShardSizePolicy):
        return
    limit = policy.max_shard_size
    for st in shardable_tensors:
        dtype = tf.as_dtype(st.dtype)
        shape = tf.TensorShape(st.shape)
        if (dtype in (tf.string, tf.variant) or not shape.is_fully_defined()
                or shape.rank == 0):
            continue
        dims = shape.as_list()
        total = shape.num_elements() * dtype.size
        if total <= limit or 0 in dims:
            continue
        thinnest = min(total // d for d in dims)
        if thinnest > limit:
            raise CheckpointError(
                f"MaxShardSizePolicy(max_shard_size={limit}) cannot split "
                f"tensor '{st.checkpoint_key}' of shape {dims} ({dtype.name}): "
                f"its thinnest slice is {thinnest} bytes, and TensorFlow's "
                "policy would loop forever on it. Use max_shard_size >= "
                f"{thinnest}.")


class ValidatingShardingCallback(ShardingCallback):
    """Runs a sharding callback, validates its shards and records metrics.

    Pass it as `tf.train.CheckpointOptions(experimental_sharding_callback=...)`
    so TensorFlow writes only validated shards. TensorFlow calls a sharding
    callback once per task; the recorded figures add up over those calls.

    Args:
        callback: Any `tf.train.experimental.ShardingCallback` instance.
        after_call: Called (without arguments) after each call, whether the
            callback and validation succeeded or not. By then the saver has
            read every tensor it writes: an asynchronous writer uses this to
            let training continue.

    Attributes:
        callback_seconds: Time spent in the wrapped callback.
        validation_seconds: Time spent validating its output.
        layout: For each shard written, its `(checkpoint_key, slice_spec)`
            pairs, in TensorFlow's shard order.
        error: The exception the callback or the validation raised, if any
            (it is also raised to TensorFlow, which then writes nothing).

    Example:

    ```python
    import tensorflow as tf
    from keras_elastic.checkpoint import ValidatingShardingCallback

    policy = ValidatingShardingCallback(
        tf.train.experimental.MaxShardSizePolicy(max_shard_size=1024))
    ckpt = tf.train.Checkpoint(v=tf.Variable(tf.zeros([1000])))
    ckpt.write("/tmp/validated/ckpt", options=tf.train.CheckpointOptions(
        experimental_sharding_callback=policy))
    print(len(policy.layout), "shards")
    ```
    """

    def __init__(self, callback: ShardingCallback, *,
                 after_call: Callable[[], None] | None = None) -> None:
        check_sharding_callback(callback)
        self._callback = callback
        self._after_call = after_call
        self.callback_seconds = 0.0
        self.validation_seconds = 0.0
        self.layout: list[list[tuple[str, str]]] = []
        self.error: BaseException | None = None

    @property
    def callback(self) -> ShardingCallback:
        """The wrapped callback."""
        return self._callback

    @property
    def description(self) -> str:
        return str(self._callback.description)

    def __call__(self, shardable_tensors: Sequence[ShardableTensor]) -> list:
        try:
            check_max_shard_size(self._callback, shardable_tensors)
            start = time.perf_counter()
            shards = self._callback(shardable_tensors)
            middle = time.perf_counter()
            layout = validate_shards(shards, shardable_tensors, self.description)
            self.callback_seconds += middle - start
            self.validation_seconds += time.perf_counter() - middle
            self.layout.extend(layout)
            return list(shards)
        except BaseException as e:
            if self.error is None:
                self.error = e
            raise
        finally:
            if self._after_call is not None:
                self._after_call()


def check_sharding_callback(callback: Any) -> ShardingCallback:
    """Returns `callback` if it is a usable `ShardingCallback` instance.

    Raises:
        TypeError: If `callback` is a class instead of an instance, or not a
            `tf.train.experimental.ShardingCallback`, or its `description` is
            not a string.

    Example:

    ```python
    import tensorflow as tf
    from keras_elastic.checkpoint.validation import check_sharding_callback

    check_sharding_callback(tf.train.experimental.ShardByTaskPolicy())
    ```
    """
    if isinstance(callback, type):
        raise TypeError(
            f"sharding_callback is the class {callback.__name__}; pass an "
            f"instance, e.g. {callback.__name__}(...)")
    if not isinstance(callback, ShardingCallback):
        raise TypeError(
            "sharding_callback must be a tf.train.experimental.ShardingCallback"
            f" instance, got {type(callback).__name__}: {callback!r}")
    description = callback.description
    if not isinstance(description, str):
        raise TypeError(
            f"sharding_callback {type(callback).__name__}.description must be "
            f"a str, got {type(description).__name__}")
    return callback
