"""Generalized tf.data batching with windows and reducers (`ke.batching`).

The window + reducer design of the tf.data batching RFC: batch each
component of a dataset's elements its own way, including padded batches of
`tf.SparseTensor`s (which `Dataset.padded_batch` rejects) and your own
batching logic as a reducer.

May import: common.

```python
import tensorflow as tf
import keras_elastic.batching as kb

def gen():
    for n in range(1, 6):
        yield {"tokens": list(range(n)),
               "tags": tf.SparseTensor([[0, n - 1]], [n], [1, n]),
               "label": n % 2}

ds = tf.data.Dataset.from_generator(
    gen, output_signature={"tokens": tf.TensorSpec([None], tf.int32),
                           "tags": tf.SparseTensorSpec([None, None], tf.int32),
                           "label": tf.TensorSpec([], tf.int64)})
batches = kb.batch(ds, 2, components={"tokens": kb.padded([8]),
                                      "tags": kb.padded_sparse([1, 8]),
                                      "label": None})  # None: as Dataset.batch
first = next(iter(batches))   # tokens [2, 8], tags dense_shape [2, 1, 8], label [2]
```

- `batch(dataset, batch_size, components=None, drop_remainder=False)`, or the
  same as a reusable spec, `Batching(batch_size, components, drop_remainder)`.
- Canned reducers: `dense()`, `padded(padded_shape, padding_value)` (as
  `Dataset.padded_batch`, also for sparse and ragged components),
  `sparse()`, `padded_sparse(padded_shape)`, `ragged(row_splits_dtype)` (as
  `Dataset.ragged_batch`), `count()`. Run-time errors have tf.data's classes
  (DataLossError for an element larger than its padded shape). They
  compile to one native `Dataset.batch`/`padded_batch`/`ragged_batch` pass
  (no Python or `tf.concat` loop per element), also when the components of
  one element mix them; every canned reducer also reduces a whole finite
  dataset with `.reduce(dataset)`.
- `reducer(init_fn, reduce_fn, finalize_fn)`: your own logic, run over
  windows made by `Dataset.window` (state may be any nest of tensors).
- `window(dataset, size, shift=1, stride=1, drop_remainder=True)`: the RFC's
  windowing (sliding by default, unlike `Dataset.window`).
"""

from keras_elastic.batching.batch import Batching, batch
from keras_elastic.batching.count import count
from keras_elastic.batching.dense import dense
from keras_elastic.batching.padded import padded
from keras_elastic.batching.ragged import ragged
from keras_elastic.batching.reducer import CannedReducer, Reducer, reducer
from keras_elastic.batching.sparse import padded_sparse, sparse
from keras_elastic.batching.window import window

__all__ = [
    "Batching",
    "CannedReducer",
    "Reducer",
    "batch",
    "count",
    "dense",
    "padded",
    "padded_sparse",
    "ragged",
    "reducer",
    "sparse",
    "window",
]
