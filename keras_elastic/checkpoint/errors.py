"""Errors raised by `keras_elastic.checkpoint`."""

from __future__ import annotations

from keras_elastic.common import errors


class CheckpointError(errors.CheckpointError, ValueError):
    """A checkpoint cannot be written, found, read or restored as asked.

    The message names the checkpoint directory or file at fault.

    Example:

    ```python
    import keras_elastic as ke

    try:
        ke.checkpoint.read_manifest("/tmp/no-such-checkpoint")
    except ke.checkpoint.CheckpointError as e:
        print(e)
    ```
    """


class NoIntactCheckpointError(CheckpointError):
    """Checkpoints exist, and every one is damaged (`integrity.verify`): the
    message names each with its faults."""


class ShardingCallbackError(CheckpointError):
    """A sharding callback returned shards that break the sharding rules.

    The rules are those of the checkpoint sharding RFC: tensors must not be
    removed, added or reshaped (re-slicing is allowed, but the slices must
    cover each tensor exactly once), dtypes must not change, and all tensors of
    a shard must belong to one task. Nothing is written when this is raised.

    Attributes:
        checkpoint_key: The checkpoint key of the offending tensor (or `None`
            when the callback's output as a whole is malformed).
        rule: The broken rule, one of the `RULE_*` constants of
            `keras_elastic.checkpoint.validation`.
        description: The sharding callback's `description`.

    Example:

    ```python
    import keras_elastic as ke

    err = ke.checkpoint.ShardingCallbackError(
        "dense/kernel", "tensors must not be removed", "Drops tensors.",
        "the tensor is missing from every shard")
    print(err.checkpoint_key, "|", err.rule)
    ```
    """

    def __init__(self, checkpoint_key: str | None, rule: str, description: str,
                 detail: str) -> None:
        self.checkpoint_key = checkpoint_key
        self.rule = rule
        self.description = description
        self.detail = detail
        where = (f"tensor '{checkpoint_key}'" if checkpoint_key is not None
                 else "its output")
        super().__init__(
            f"Sharding callback {description!r} broke the rule '{rule}' for "
            f"{where}: {detail}. Nothing was written; the previous checkpoint "
            "is unchanged.")


class ModelMismatchError(CheckpointError):
    """A checkpoint's variables (keys, shapes) differ from the model's, found
    before anything was restored.

    Attributes:
        path: The checkpoint.
        differences: One line per variable that differs.

    Example:

    ```python
    import keras_elastic as ke

    try:
        callback.restore(model)
    except ke.checkpoint.ModelMismatchError as e:
        print(e.path, e.differences)
    ```
    """

    def __init__(self, message: str, path: str, differences: list[str]) -> None:
        super().__init__(message)
        self.path = path
        self.differences = list(differences)
