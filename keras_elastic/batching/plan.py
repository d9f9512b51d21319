"""How a canned reducer maps onto one native tf.data batching op.

A canned reducer does not loop over elements in Python or with `tf.concat`.
For each component it gives a `Plan` for one of three native ops:

- `BATCH`: `Dataset.batch`, which takes dense tensors of one shape,
  `tf.SparseTensor`s and `tf.RaggedTensor`s;
- `PADDED`: `Dataset.padded_batch`, which takes dense tensors of one rank;
- `RAGGED`: `Dataset.ragged_batch`, which is `Dataset.batch` except that a
  dense part of known rank whose static shape is not fully known becomes a
  `tf.RaggedTensor` batch (ragged up to its last dimension of unknown size,
  int64 row splits). It encodes such parts with one cheap op per element, so
  it batches padded, ragged and sparse components together without a codec.
  Ragged components of ragged_rank 0 (see `is_ragged_rank_zero`) cannot
  take this op: their plans raise `Infeasible`.

A plan says how one element's component becomes the *part* that op batches
(`encode`, run in a per-element `map`, or None when the component goes in as
it is), and how the batched part becomes the reducer's output (`decode`, run
once per batch, or None when the batched part is the output). `ke.batching.batch`
picks the op for which the whole element needs the least extra work (see
`native.cost`), so that when every component maps onto the native op
unchanged the pipeline *is* that op. Under `RAGGED`, an encoded part is
batched by `Dataset.ragged_batch` too (a dense part of unknown sizes
becomes ragged).

Whatever the op, a reducer's result is the same: values, dtypes and static
shapes (tests compare every op with each component batched on its own).
A ragged batch has no rows below an empty dimension (the 5 of an element
of shape `[0, 5]`), so plans that need the elements' sizes there carry them
beside the element.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from keras_elastic.batching.checks import shape_str
from keras_elastic.batching.structure import Path, path_str

BATCH = "batch"
PADDED = "padded"
RAGGED = "ragged"
MODES = (BATCH, PADDED, RAGGED)  # on equal cost, the first wins
OP_NAMES = {BATCH: "Dataset.batch", PADDED: "Dataset.padded_batch",
            RAGGED: "Dataset.ragged_batch"}


class Kind(enum.Enum):
    """What a component is."""

    DENSE = "dense tf.Tensor"
    SPARSE = "tf.SparseTensor"
    RAGGED = "tf.RaggedTensor"
    OTHER = "other"


def kind_of(spec: Any) -> Kind:
    """The `Kind` of one component's `tf.TypeSpec`."""
    if isinstance(spec, tf.RaggedTensorSpec):
        return Kind.RAGGED
    if isinstance(spec, tf.SparseTensorSpec):
        return Kind.SPARSE
    if isinstance(spec, tf.TensorSpec):
        return Kind.DENSE
    return Kind.OTHER


def spec_name(spec: Any) -> str:
    """A short description of a component spec, for error messages."""
    kind = kind_of(spec)
    if kind is Kind.OTHER:
        return type(spec).__name__
    return (f"{kind.value} of shape {shape_str(spec.shape)} and dtype "
            f"{spec.dtype.name}")


class Infeasible(ValueError):
    """This reducer cannot run under this mode for this component."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one component is batched by the chosen native op.

    Attributes:
      encode: per-element function from the component to the part batched
        (a tensor, composite, or nest of tensors), or None to batch the
        component as it is.
      decode: per-batch function from the batched part to the output, or None.
      padded_shapes: for `PADDED` mode, the `padded_shapes` nest of the part.
      padding_values: for `PADDED` mode, the `padding_values` nest of the part.
    """

    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None
    padded_shapes: Any = None
    padding_values: Any = None

    def then(self, post: Callable[[Any], Any]) -> Plan:
        """This plan with `post` applied after its decode."""
        first = self.decode
        decode = post if first is None else (lambda batched: post(first(batched)))
        return dataclasses.replace(self, decode=decode)

    def before(self, pre: Callable[[Any], Any]) -> Plan:
        """This plan with `pre` applied to the component before its encode."""
        second = self.encode
        encode = pre if second is None else (lambda value: second(pre(value)))
        return dataclasses.replace(self, encode=encode)


def zero(dtype: tf.DType) -> tf.Tensor:
    """The default padding value of a dtype: 0, False or the empty string."""
    return tf.zeros([], dtype)


def is_ragged_rank_zero(spec: Any) -> bool:
    """A `RaggedTensorSpec` with ragged_rank 0 (e.g. from `from_tensor_slices`).

    Its values are plain `tf.Tensor`s inside a `map`, and only the dataset's
    spec makes `Dataset.batch` treat them as ragged. A `map` that returns
    such a value would turn it into a dense component, so when the pipeline
    needs a map these components travel wrapped (see `ragged_passthrough`).
    """
    return isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank == 0


def wrap_as_ragged(value: tf.Tensor, ragged_rank: int,
                   row_splits_dtype: tf.DType) -> tf.RaggedTensor:
    """Wraps a dense element as a `[1, (d0), ..., (d_k), ...]` ragged tensor.

    `Dataset.batch` batches these into `[n, (1), (d0), ...]`, whose `.values`
    is the batch `[n, (d0), ..., (d_k), ...]` with ragged_rank `k + 1`, where
    `k = ragged_rank - 1`. Dense elements of different shapes batch this way.
    """
    return tf.RaggedTensor.from_tensor(value[tf.newaxis], ragged_rank=ragged_rank,
                                       row_splits_dtype=row_splits_dtype)


def unwrap_ragged(batched: tf.RaggedTensor) -> tf.RaggedTensor:
    """Undoes `wrap_as_ragged` on a batch."""
    return batched.values


def ragged_passthrough(spec: Any, mapped: bool) -> Plan:
    """`BATCH` plan handing a component to `Dataset.batch` as it is."""
    if mapped and is_ragged_rank_zero(spec):
        return Plan(
            encode=lambda value: wrap_as_ragged(value, 1, spec.row_splits_dtype),
            decode=unwrap_ragged)
    return Plan()


def ragged_feasible(spec: Any, path: Path, name: str) -> None:
    """Raises `Infeasible` for a ragged_rank-0 component under `RAGGED` mode.

    Inside a map such a component is a plain tensor, which `Dataset.ragged_batch`
    would treat as dense; the other modes batch it as `Dataset.batch` does.
    """
    if is_ragged_rank_zero(spec):
        raise Infeasible(
            f"{name} at `{path_str(path)}` has a ragged component of ragged_rank 0, "
            "which Dataset.ragged_batch would batch as a dense one")


def becomes_ragged(shape: tf.TensorShape) -> bool:
    """Whether `Dataset.ragged_batch` batches a dense part of `shape` as ragged."""
    return shape.rank is not None and not shape.is_fully_defined()


def last_unknown_axis(shape: tf.TensorShape) -> int:
    """The last axis of unknown size, or -1."""
    dims = shape.as_list()
    unknown = [axis for axis, size in enumerate(dims) if size is None]
    return unknown[-1] if unknown else -1


def leading_dim(batched: Any) -> tf.Tensor:
    """The number of elements in a batched component, as int64."""
    if isinstance(batched, tf.SparseTensor):
        return batched.dense_shape[0]
    if isinstance(batched, tf.RaggedTensor):
        return tf.cast(batched.nrows(), tf.int64)
    return tf.shape(batched, out_type=tf.int64)[0]
