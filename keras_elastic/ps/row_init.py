"""Deterministic initial rows of embedding tables held by parameter servers.

A parameter server creates the row of an embedding id the first time a worker
looks it up or sends a gradient for it. Which server owns an id, and in which
order or batch its rows are created, depends on the number of servers and on
timing, so the initial row must not: `initial_rows` makes the row of an id a
pure function of (initializer config, seed, id, dim). A table therefore starts
from the same rows whatever the number of servers, and a server that recreates
a row it lost gets the same row again.

Random numbers come from a counter-based generator (SplitMix64, vectorized
with NumPy uint64 arithmetic): row `id` uses the SplitMix64 stream whose state
is a hash of (seed, id), and element `k` of that stream is `mix(state + (k + 1)
* 0x9E3779B97F4A7C15)`, so any element is computed directly from its counter.
Uniform floats in [0, 1) use the top 53 bits of an output.

Supported initializers (Keras configs from `keras.initializers.serialize`, or
their string names, e.g. "uniform", the default of `keras.layers.Embedding`):

- RandomUniform ("uniform", "random_uniform"): uniform in [minval, maxval),
- RandomNormal ("normal", "random_normal"): normal(mean, stddev), by
  Box-Muller,
- TruncatedNormal ("truncated_normal"): normal(mean, stddev) redrawn (with
  other counters) until within 2 stddev of the mean, like Keras,
- Zeros ("zeros", "zero"), Ones ("ones", "one"), Constant ("constant";
  `value` a number).

Initializers that depend on the shape of the whole table (GlorotUniform,
HeNormal, VarianceScaling, Orthogonal, ...) are refused: a server only sees
rows. A config with `seed: None` uses `DEFAULT_SEED` (Keras would pick a new
random seed on every call, which would give every server different rows). The
rows are not the ones Keras itself would draw for the same seed: they come
from a different generator.

Example:

>>> import numpy as np
>>> config = {"class_name": "RandomUniform",
...           "config": {"minval": -0.05, "maxval": 0.05, "seed": None}}
>>> rows = initial_rows(config, np.array([7, 3], "int64"), 4, "float32")
>>> rows.shape, rows.dtype.name
((2, 4), 'float32')
>>> bool(np.all(np.abs(rows) <= 0.05))
True
>>> again = initial_rows(config, np.array([3], "int64"), 4, "float32")
>>> bool(np.array_equal(again[0], rows[1]))
True
"""

from __future__ import annotations

import math
import numbers

import numpy as np

DEFAULT_SEED = 1337  # used when an initializer's config has "seed": None

# Canonical names, and the string aliases Keras accepts for them.
_ALIASES = {
    "randomuniform": "RandomUniform",
    "random_uniform": "RandomUniform",
    "uniform": "RandomUniform",
    "randomnormal": "RandomNormal",
    "random_normal": "RandomNormal",
    "normal": "RandomNormal",
    "truncatednormal": "TruncatedNormal",
    "truncated_normal": "TruncatedNormal",
    "zeros": "Zeros",
    "zero": "Zeros",
    "ones": "Ones",
    "one": "Ones",
    "constant": "Constant",
}
SUPPORTED = ("RandomUniform", "RandomNormal", "TruncatedNormal", "Zeros", "Ones",
             "Constant")
_SHAPE_DEPENDENT = {
    "glorotuniform", "glorotnormal", "heuniform", "henormal", "lecununiform",
    "lecunnormal", "variancescaling", "orthogonal", "orthogonalinitializer",
    "identity", "identityinitializer",
}
_OPTIONS = {
    "RandomUniform": {"minval": -0.05, "maxval": 0.05, "seed": None},
    "RandomNormal": {"mean": 0.0, "stddev": 0.05, "seed": None},
    "TruncatedNormal": {"mean": 0.0, "stddev": 0.05, "seed": None},
    "Zeros": {},
    "Ones": {},
    "Constant": {"value": 0.0},
}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_TO_UNIT = 2.0 ** -53
# Counter offsets that separate the streams of different uses of one row.
_NORMAL_STREAM = 1 << 32  # Box-Muller pairs (redraw r of column k: 2 * (r*dim + k))
_MAX_REDRAWS = 64  # P(a value still outside 2 stddev after 64 draws) ~ 1e-86


def _mix(z: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer (a bijection of uint64), in place on `z`."""
    z ^= z >> _S30
    z *= _MIX_1
    z ^= z >> _S27
    z *= _MIX_2
    z ^= z >> _S31
    return z


def _row_states(seed: int, ids: np.ndarray) -> np.ndarray:
    """Per-id SplitMix64 state: a hash of (seed, id)."""
    seed_key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64))
    return _mix(_mix(ids.astype(np.int64).view(np.uint64) ^ seed_key) + _GOLDEN)


def _uniform(states: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniform floats in [0, 1): element `counters` of the streams `states`.

    `states` has shape [n, 1] (or [m]), `counters` [dim] (or [m]); float64.
    """
    z = _mix(states + (counters.astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return (z >> _S11).astype(np.float64) * _TO_UNIT


def _standard_normal(states: np.ndarray, columns: np.ndarray, dim: int,
                     redraw: int) -> np.ndarray:
    """Box-Muller normals for draw `redraw` of `columns` (one float per pair)."""
    pair = np.uint64(_NORMAL_STREAM) + np.uint64(2) * (
        np.uint64(redraw) * np.uint64(dim) + columns.astype(np.uint64))
    u1 = _uniform(states, pair)
    u2 = _uniform(states, pair + np.uint64(1))
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)


def parse_initializer(config: dict | str) -> tuple[str, dict]:
    """The canonical class name and options (defaults filled) of a config.

    Raises ValueError for initializers `initial_rows` does not support and for
    options it does not know.

    >>> parse_initializer("uniform")
    ('RandomUniform', {'minval': -0.05, 'maxval': 0.05, 'seed': None})
    >>> parse_initializer({"class_name": "Constant", "config": {"value": 2}})
    ('Constant', {'value': 2})
    """
    if isinstance(config, str):
        class_name, options = config, {}
    elif isinstance(config, dict) and isinstance(config.get("class_name"), str):
        class_name = config["class_name"]
        options = config.get("config") or {}
        if not isinstance(options, dict):
            raise ValueError(f"the initializer config {config!r} has a 'config' that "
                             f"is not a dict")
        module = config.get("module")
        if module is not None and not str(module).startswith("keras"):
            raise ValueError(
                f"embedding rows cannot use the custom initializer {class_name!r} "
                f"from module {module!r}: supported are the Keras initializers "
                f"{', '.join(SUPPORTED)}")
    else:
        raise ValueError(f"an initializer must be a Keras initializer config (a dict "
                         f"with 'class_name' and 'config', as given by "
                         f"keras.initializers.serialize) or a name, got {config!r}")
    name = _ALIASES.get(class_name.lower()) or _ALIASES.get(class_name)
    if name is None:
        why = ""
        if class_name.lower().replace("_", "") in _SHAPE_DEPENDENT:
            why = " (it depends on the shape of the whole table, which no server sees)"
        raise ValueError(
            f"embedding rows cannot use the initializer {class_name!r}{why}: supported "
            f"are {', '.join(SUPPORTED)} (or their names such as 'uniform', "
            f"'normal', 'truncated_normal', 'zeros', 'ones')")
    unknown = sorted(set(options) - set(_OPTIONS[name]))
    if unknown:
        raise ValueError(f"the initializer {name} has options {unknown} that embedding "
                         f"rows do not support (known: {sorted(_OPTIONS[name])})")
    merged = {**_OPTIONS[name], **options}
    seed = merged.get("seed")
    if seed is not None and (isinstance(seed, bool)
                             or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"the initializer {name} has seed {seed!r}: embedding rows "
                         f"need an integer seed or None")
    for key in ("minval", "maxval", "mean", "stddev", "value"):
        if key in merged and (isinstance(merged[key], bool)
                              or not isinstance(merged[key], numbers.Real)):
            raise ValueError(f"the initializer {name} has {key}={merged[key]!r}: "
                             f"embedding rows need a number")
    if name in ("RandomNormal", "TruncatedNormal") and merged["stddev"] < 0:
        raise ValueError(f"the initializer {name} has a negative stddev "
                         f"{merged['stddev']}")
    return name, merged


def initial_rows(config: dict | str, ids: np.ndarray, dim: int,
                 dtype: str | np.dtype = "float32") -> np.ndarray:
    """The initial rows of embedding `ids`: an array [len(ids), dim] of `dtype`.

    Row i depends only on (config, seed, ids[i], dim), never on the other ids.
    Raises ValueError for an unsupported initializer (also when `ids` is empty,
    so a table can check its config up front).

    >>> import numpy as np
    >>> rows = initial_rows("truncated_normal", np.arange(1000), 8, "float32")
    >>> bool(np.all(np.abs(rows) <= 2 * 0.05))
    True
    >>> initial_rows({"class_name": "Constant", "config": {"value": 3}},
    ...              np.array([5]), 2, "float64").tolist()
    [[3.0, 3.0]]
    """
    name, options = parse_initializer(config)
    try:
        dtype = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"embedding rows cannot have dtype {dtype!r}: {e}") from e
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim <= 0:
        raise ValueError(f"an embedding dim must be a positive integer, got {dim!r}")
    dim = int(dim)
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(f"ids must be a 1-D integer array, got dtype {ids.dtype} and "
                         f"shape {ids.shape}")
    n = len(ids)
    if name == "Zeros":
        return np.zeros((n, dim), dtype)
    if name == "Ones":
        return np.ones((n, dim), dtype)
    if name == "Constant":
        return np.full((n, dim), options["value"], dtype)
    seed = DEFAULT_SEED if options["seed"] is None else int(options["seed"])
    states = _row_states(seed, ids)[:, None]
    columns = np.arange(dim, dtype=np.uint64)
    if name == "RandomUniform":
        lo, hi = float(options["minval"]), float(options["maxval"])
        rows = (lo + (hi - lo) * _uniform(states, columns)).astype(dtype)
        if hi > lo:  # rounding to `dtype` must not reach maxval
            top = np.nextafter(np.array(hi, dtype), np.array(lo, dtype))
            np.minimum(rows, top, out=rows)
        return rows
    z = _standard_normal(states, columns, dim, 0)
    if name == "TruncatedNormal":
        bad_rows, bad_cols = np.nonzero(np.abs(z) > 2.0)
        for redraw in range(1, _MAX_REDRAWS + 1):
            if not len(bad_rows):
                break
            again = _standard_normal(states[bad_rows, 0], bad_cols.astype(np.uint64),
                                     dim, redraw)
            z[bad_rows, bad_cols] = again
            keep = np.abs(again) > 2.0
            bad_rows, bad_cols = bad_rows[keep], bad_cols[keep]
        np.clip(z, -2.0, 2.0, out=z)  # never reached in practice
    return (float(options["mean"]) + float(options["stddev"]) * z).astype(dtype)
