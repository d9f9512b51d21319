"""A model's variable signature in a checkpoint's manifest, and its check.

`ShardedModelCheckpoint` records `{key: shape}` of the model's variables (keys
as in `keras_elastic.common.variable_keys`: position and short name, stable
across processes) in every manifest it writes. Before a restore it compares the
model with it, so a checkpoint of another model is an error that names the
difference instead of a partial or shape-mismatched restore.

Example:

>>> import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
>>> model_signature(model)
{'0000/kernel': [2, 1], '0001/bias': [1]}
>>> signature_difference({'0000/kernel': [3, 1], '0001/bias': [1]},
...                      model_signature(model))
['0000/kernel: shape [3, 1] in the checkpoint, [2, 1] in the model']
"""

from __future__ import annotations

from typing import Any

from keras_elastic.checkpoint.errors import ModelMismatchError
from keras_elastic.checkpoint.manifest import SaveInfo
from keras_elastic.common.variable_keys import model_variables, variable_keys

SIGNATURE_KEY = "variables"  # in a manifest's extra


def model_signature(model: Any) -> dict[str, list[int | None]]:
    """`{key: shape}` of the model's weights (trainable first)."""
    return {k: [None if d is None else int(d) for d in v.shape]
            for k, v in zip(variable_keys(model), model_variables(model))}


def signature_difference(saved: dict[str, list], current: dict[str, list]
                         ) -> list[str]:
    """What differs between a checkpoint's signature and a model's, one line
    per variable (empty if they match)."""
    lines = []
    for key in saved:
        if key not in current:
            lines.append(f"{key}: in the checkpoint, not in the model")
        elif list(saved[key]) != list(current[key]):
            lines.append(f"{key}: shape {list(saved[key])} in the checkpoint, "
                         f"{list(current[key])} in the model")
    lines += [f"{key}: in the model, not in the checkpoint"
              for key in current if key not in saved]
    return lines


def check_model_matches(model: Any, info: SaveInfo) -> None:
    """Raises `ModelMismatchError` (a `CheckpointError`) naming each variable
    that differs between the model and the checkpoint `info` (checkpoints
    without a signature pass)."""
    saved = info.extra.get(SIGNATURE_KEY)
    if not saved or not getattr(model, "built", True):
        return
    difference = signature_difference(saved, model_signature(model))
    if difference:
        shown = "\n  ".join(difference[:10])
        more = f"\n  ... and {len(difference) - 10} more" if len(difference) > 10 else ""
        raise ModelMismatchError(
            f"Checkpoint {info.path} does not match model {model.name!r} "
            f"({len(difference)} variable(s) differ):\n  {shown}{more}\n"
            "Restore it into the model it was saved from, or point the callback "
            "at another directory (or pass restore_on_start=False) to train afresh.",
            info.path, difference)
