"""`window()`: combine consecutive elements into finite datasets (windows)."""

from __future__ import annotations

import numbers

import tensorflow as tf


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"window(): {name} must be an int, got {value!r}.")
    if value < 1:
        raise ValueError(f"window(): {name} must be at least 1, got {value}.")
    return int(value)


def window(dataset: tf.data.Dataset, size: int, shift: int = 1, stride: int = 1,
           drop_remainder: bool = True) -> tf.data.Dataset:
    """Combines input elements into a dataset of windows (the RFC's `window`).

    Each window is itself a finite dataset of `size` consecutive elements (or
    fewer at the end, if `drop_remainder` is False); for an element that is
    a nest, a window is the same nest of datasets, one per component, ready
    for reducers (see `ke.batching.reducer` and the canned reducers'
    `reduce`). `stride` is the step between the input elements of one
    window, and `shift` the step between the first elements of consecutive
    windows.

    The defaults follow the RFC, not `Dataset.window`: windows slide by one
    element (`shift=1`) and incomplete windows are dropped
    (`drop_remainder=True`), so

    - `window(range(5), 3)` gives `{0, 1, 2}, {1, 2, 3}, {2, 3, 4}`;
    - `window(range(5), 3, 3, 1, False)` gives `{0, 1, 2}, {3, 4}`;
    - `window(range(6), 3, 1, 2)` gives `{0, 2, 4}, {1, 3, 5}`.

    Example:

    ```python
    import tensorflow as tf
    import keras_elastic.batching as kb

    windows = kb.window(tf.data.Dataset.range(5), 3)
    [list(w.as_numpy_iterator()) for w in windows]   # [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    ```

    Args:
      dataset: the input dataset.
      size: the number of elements in a window.
      shift: how many input elements the window moves forward each time.
      stride: the step between the input elements of a window.
      drop_remainder: whether to drop windows with fewer than `size` elements.

    Returns:
      A dataset whose elements are windows.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"window(): dataset must be a tf.data.Dataset, got "
                        f"{type(dataset).__name__}.")
    size = _positive_int(size, "size")
    shift = _positive_int(shift, "shift")
    stride = _positive_int(stride, "stride")
    if not isinstance(drop_remainder, bool):
        raise TypeError(f"window(): drop_remainder must be a bool, got "
                        f"{drop_remainder!r}.")
    return dataset.window(size, shift=shift, stride=stride,
                          drop_remainder=drop_remainder)
