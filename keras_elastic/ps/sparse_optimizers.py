"""Row-wise (lazy) optimizer updates of embedding rows on a parameter server.

Built from the same Keras optimizer config the parameter server already gets
(`keras.optimizers.serialize(optimizer)`), NumPy only. `apply` updates the rows
of the ids of one step, and their optimizer slots, in place; the formulas are
those of Keras 3's `update_step` (`keras/src/optimizers/{sgd,adagrad,adam,
ftrl}.py`), computed in the dtype of the rows like Keras does (hyperparameters
and the learning rate cast to it). The caller passes one gradient row per
unique id (duplicate ids' gradients summed first, as the dense gradient of the
full table would), the 1-based number of the step, and the current learning
rate of its Keras optimizer, so learning-rate schedules apply.

How each compares with Keras' dense update of the full table (a variable
[input_dim, dim] whose gradient is zero outside the ids of the step):

- SGD without momentum, Adagrad: identical. A row with a zero gradient does
  not change in the dense update either (Adagrad adds 0 to its accumulator).
- SGD with momentum (and Nesterov): lazy. Dense would keep moving a row with a
  zero gradient by its decaying velocity; here a row and its momentum change
  only at the steps that have a gradient for it.
- Adam (and AMSGrad): lazy, like TF Addons' LazyAdam and ElasticDL: m, v and
  the row change only for the ids of the step, with the bias correction of the
  global step. Dense would decay m and v and move every row with m != 0.
- Ftrl: lazy. Dense recomputes every row from its `linear` slot at every
  step, so at the first step it sets all rows that never had a gradient to 0
  (their linear is 0), and with l2_shrinkage it shrinks all of them; here only
  the rows of the step change (Keras' own doc: "when input is sparse shrinkage
  will only happen on the active weights").

For the rows of a step the formulas are Keras' exactly, so a row updated at
every step follows the dense update exactly.

Not implemented, refused with a ValueError naming the option: weight_decay,
clipnorm, clipvalue, global_clipnorm, use_ema, gradient_accumulation_steps,
loss_scale_factor. Other optimizers (RMSprop, Adamax, Nadam, AdamW, ...) are
refused too.

Example:

>>> import numpy as np
>>> opt = sparse_optimizer_from_config(
...     {"class_name": "Adagrad", "config": {"initial_accumulator_value": 0.1}})
>>> opt.slot_names
('accumulator',)
>>> values = np.ones((2, 3), "float32")
>>> slots = opt.initial_slots(2, 3, "float32")
>>> opt.apply(values, slots, np.ones((2, 3), "float32"), step=1, learning_rate=0.1)
>>> slots["accumulator"][0].tolist()
[1.100000023841858, 1.100000023841858, 1.100000023841858]
"""

from __future__ import annotations

import abc
import math
import numbers

import numpy as np

SUPPORTED = ("SGD", "Adagrad", "Adam", "Ftrl")

# Base optimizer options and their values that need no work here.
_IGNORED = ("name", "learning_rate", "ema_momentum", "ema_overwrite_frequency",
            "decay")  # Keras ignores `decay`; the PS passes the learning rate
_REFUSED = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema",
            "gradient_accumulation_steps", "loss_scale_factor")


def _is_off(option: str, value: object) -> bool:
    """Whether a refused base option is set to a value that does nothing."""
    if value is None or value is False:
        return True
    # Keras skips gradient accumulation for 0, and weight decay 0 is a no-op.
    return option in ("weight_decay", "gradient_accumulation_steps") and value == 0


def _number(cls: str, key: str, value: object, low: float | None = None,
            high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value)):
        raise ValueError(f"{cls} option {key}={value!r} must be a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low if low is not None else '-inf'}, " \
                 f"{high if high is not None else 'inf'}]"
        raise ValueError(f"{cls} option {key}={value!r} must be in {bounds}")
    return float(value)


class SparseOptimizer(abc.ABC):
    """Updates embedding rows and their slots; see the module docstring.

    Subclasses set `slot_names` and `_initial` (the initial value of each
    slot) and implement `_update`.
    """

    name = "SparseOptimizer"
    slot_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._initial: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"Sparse{self.name}({self.get_config()})"

    def get_config(self) -> dict:
        """The hyperparameters this optimizer uses."""
        return {}

    def initial_slots(self, n: int, dim: int,
                      dtype: str | np.dtype) -> dict[str, np.ndarray]:
        """New slots for `n` rows: {slot name: array [n, dim] of `dtype`}.

        >>> opt = sparse_optimizer_from_config({"class_name": "Adam", "config": {}})
        >>> sorted(opt.initial_slots(4, 2, "float32"))
        ['momentum', 'velocity']
        """
        return {slot: np.full((n, dim), self._initial[slot], dtype)
                for slot in self.slot_names}

    def apply(self, values: np.ndarray, slots: dict[str, np.ndarray], grads: np.ndarray,
              step: int, learning_rate: float) -> None:
        """Updates `values` [n, dim] and `slots` in place with `grads` [n, dim].

        One gradient row per unique id; `step` is the 1-based number of this
        update (Adam's bias correction), `learning_rate` the current one.

        >>> opt = sparse_optimizer_from_config({"class_name": "SGD", "config": {}})
        >>> values = np.ones((1, 2), "float32")
        >>> opt.apply(values, {}, np.ones((1, 2), "float32"), 1, 0.5)
        >>> values.tolist()
        [[0.5, 0.5]]
        """
        if not isinstance(values, np.ndarray) or values.ndim != 2:
            raise ValueError(f"{self.name}: values must be a 2-D array [n, dim], got "
                             f"{type(values).__name__} of shape {np.shape(values)}")
        grads = np.asarray(grads)
        if grads.shape != values.shape:
            raise ValueError(f"{self.name}: gradients have shape {grads.shape}, the "
                             f"rows {values.shape}")
        if set(slots) != set(self.slot_names):
            raise ValueError(f"{self.name}: slots {sorted(slots)} given, expected "
                             f"{sorted(self.slot_names)}")
        for slot, array in slots.items():
            if not isinstance(array, np.ndarray) or array.shape != values.shape:
                raise ValueError(f"{self.name}: slot {slot!r} has shape "
                                 f"{np.shape(array)}, the rows {values.shape}")
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 1:
            raise ValueError(f"{self.name}: step must be an integer >= 1, got {step!r}")
        try:
            learning_rate = float(learning_rate)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self.name}: learning_rate must be a number, got "
                             f"{learning_rate!r}") from e
        _number(self.name, "learning_rate", learning_rate)
        dt = values.dtype.type
        self._update(values, slots, grads.astype(values.dtype, copy=False), int(step),
                     dt(learning_rate))

    @abc.abstractmethod
    def _update(self, values: np.ndarray, slots: dict[str, np.ndarray],
                grads: np.ndarray, step: int, lr: np.floating) -> None:
        """The optimizer's row update, in place (arguments checked)."""


class SparseSGD(SparseOptimizer):
    """keras.optimizers.SGD; slot "momentum" only when momentum > 0."""

    name = "SGD"

    def __init__(self, momentum: float = 0.0, nesterov: bool = False) -> None:
        super().__init__()
        self.momentum = _number("SGD", "momentum", momentum, 0.0, 1.0)
        if not isinstance(nesterov, bool):
            raise ValueError(f"SGD option nesterov={nesterov!r} must be a bool")
        self.nesterov = nesterov
        self.slot_names = ("momentum",) if self.momentum != 0 else ()
        self._initial = {"momentum": 0.0}

    def get_config(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov}

    def _update(self, values, slots, grads, step, lr):
        if not self.slot_names:
            values -= grads * lr
            return
        m = slots["momentum"]
        momentum = values.dtype.type(self.momentum)
        m *= momentum
        m -= grads * lr
        if self.nesterov:
            values += m * momentum - grads * lr
        else:
            values += m


class SparseAdagrad(SparseOptimizer):
    """keras.optimizers.Adagrad; slot "accumulator"."""

    name = "Adagrad"
    slot_names = ("accumulator",)

    def __init__(self, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7) -> None:
        super().__init__()
        self.initial_accumulator_value = _number(
            "Adagrad", "initial_accumulator_value", initial_accumulator_value, 0.0)
        self.epsilon = _number("Adagrad", "epsilon", epsilon)
        self._initial = {"accumulator": self.initial_accumulator_value}

    def get_config(self) -> dict:
        return {"initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon}

    def _update(self, values, slots, grads, step, lr):
        accumulator = slots["accumulator"]
        accumulator += np.square(grads)
        values -= (lr * grads) / np.sqrt(accumulator + values.dtype.type(self.epsilon))


class SparseAdam(SparseOptimizer):
    """keras.optimizers.Adam (lazy); slots "momentum", "velocity" and, with
    amsgrad, "velocity_hat"."""

    name = "Adam"

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, amsgrad: bool = False) -> None:
        super().__init__()
        self.beta_1 = _number("Adam", "beta_1", beta_1, 0.0, 1.0)
        self.beta_2 = _number("Adam", "beta_2", beta_2, 0.0, 1.0)
        self.epsilon = _number("Adam", "epsilon", epsilon)
        if not isinstance(amsgrad, bool):
            raise ValueError(f"Adam option amsgrad={amsgrad!r} must be a bool")
        self.amsgrad = amsgrad
        self.slot_names = ("momentum", "velocity") + (("velocity_hat",) if amsgrad
                                                      else ())
        self._initial = dict.fromkeys(self.slot_names, 0.0)

    def get_config(self) -> dict:
        return {"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "amsgrad": self.amsgrad}

    def _update(self, values, slots, grads, step, lr):
        dt = values.dtype.type
        local_step = dt(step)
        beta_1_power = np.power(dt(self.beta_1), local_step)
        beta_2_power = np.power(dt(self.beta_2), local_step)
        alpha = lr * np.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m, v = slots["momentum"], slots["velocity"]
        m += (grads - m) * dt(1 - self.beta_1)
        v += (np.square(grads) - v) * dt(1 - self.beta_2)
        if self.amsgrad:
            v_hat = slots["velocity_hat"]
            np.maximum(v_hat, v, out=v_hat)
            v = v_hat
        values -= (m * alpha) / (np.sqrt(v) + dt(self.epsilon))


class SparseFtrl(SparseOptimizer):
    """keras.optimizers.Ftrl (lazy); slots "accumulator" and "linear"."""

    name = "Ftrl"
    slot_names = ("accumulator", "linear")

    def __init__(self, learning_rate_power: float = -0.5,
                 initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0,
                 l2_shrinkage_regularization_strength: float = 0.0,
                 beta: float = 0.0) -> None:
        super().__init__()
        self.learning_rate_power = _number("Ftrl", "learning_rate_power",
                                           learning_rate_power, high=0.0)
        self.initial_accumulator_value = _number(
            "Ftrl", "initial_accumulator_value", initial_accumulator_value, 0.0)
        self.l1_regularization_strength = _number(
            "Ftrl", "l1_regularization_strength", l1_regularization_strength, 0.0)
        self.l2_regularization_strength = _number(
            "Ftrl", "l2_regularization_strength", l2_regularization_strength, 0.0)
        self.l2_shrinkage_regularization_strength = _number(
            "Ftrl", "l2_shrinkage_regularization_strength",
            l2_shrinkage_regularization_strength, 0.0)
        self.beta = _number("Ftrl", "beta", beta)
        self._initial = {"accumulator": self.initial_accumulator_value, "linear": 0.0}

    def get_config(self) -> dict:
        return {"learning_rate_power": self.learning_rate_power,
                "initial_accumulator_value": self.initial_accumulator_value,
                "l1_regularization_strength": self.l1_regularization_strength,
                "l2_regularization_strength": self.l2_regularization_strength,
                "l2_shrinkage_regularization_strength":
                    self.l2_shrinkage_regularization_strength,
                "beta": self.beta}

    def _update(self, values, slots, grads, step, lr):
        dt = values.dtype.type
        accum, linear = slots["accumulator"], slots["linear"]
        power = dt(-self.learning_rate_power)
        l2_reg = dt(self.l2_regularization_strength) + dt(self.beta) / (dt(2.0) * lr)
        grad_to_use = grads + dt(2 * self.l2_shrinkage_regularization_strength) * values
        new_accum = accum + np.square(grads)
        new_accum_power = np.power(new_accum, power)
        linear += grad_to_use - (new_accum_power - np.power(accum, power)) / lr * values
        quadratic = new_accum_power / lr + dt(2) * l2_reg
        l1 = dt(self.l1_regularization_strength)
        linear_clipped = np.clip(linear, -l1, l1)
        values[...] = (linear_clipped - linear) / quadratic
        accum[...] = new_accum


_CLASSES: dict[str, type[SparseOptimizer]] = {
    "sgd": SparseSGD, "adagrad": SparseAdagrad, "adam": SparseAdam, "ftrl": SparseFtrl}
_OPTIONS = {
    "sgd": ("momentum", "nesterov"),
    "adagrad": ("initial_accumulator_value", "epsilon"),
    "adam": ("beta_1", "beta_2", "epsilon", "amsgrad"),
    "ftrl": ("learning_rate_power", "initial_accumulator_value",
             "l1_regularization_strength", "l2_regularization_strength",
             "l2_shrinkage_regularization_strength", "beta"),
}


def sparse_optimizer_from_config(config: dict) -> SparseOptimizer:
    """The row-wise optimizer of a Keras optimizer config.

    `config` is `keras.optimizers.serialize(optimizer)` (a dict with
    "class_name" and "config"; "module" "keras.optimizers"). Raises ValueError
    for other optimizers, unknown options and options not implemented here.

    >>> sparse_optimizer_from_config({"module": "keras.optimizers",
    ...     "class_name": "SGD", "config": {"momentum": 0.9, "nesterov": True}})
    SparseSGD({'momentum': 0.9, 'nesterov': True})
    >>> sparse_optimizer_from_config({"class_name": "RMSprop", "config": {}})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ... the optimizer 'RMSprop': supported are SGD, Adagrad, Adam, Ftrl
    """
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise ValueError(f"an optimizer config must be a dict with 'class_name' and "
                         f"'config' (keras.optimizers.serialize), got {config!r}")
    class_name = config["class_name"]
    module = config.get("module")
    key = class_name.lower()
    if key not in _CLASSES or (module is not None
                               and not str(module).startswith("keras")):
        custom = module is not None and not str(module).startswith("keras")
        where = f" from module {module!r}" if custom else ""
        raise ValueError(f"embedding tables on parameter servers cannot use the "
                         f"optimizer {class_name!r}{where}: supported are "
                         f"{', '.join(SUPPORTED)}")
    options = config.get("config") or {}
    if not isinstance(options, dict):
        raise ValueError(f"the optimizer config {config!r} has a 'config' that is not "
                         f"a dict")
    name = _CLASSES[key].name
    for option in _REFUSED:
        if not _is_off(option, options.get(option)):
            raise ValueError(f"embedding tables on parameter servers do not support "
                             f"the {name} option {option}={options[option]!r}: leave "
                             f"it unset ({', '.join(_REFUSED)} are not implemented)")
    unknown = sorted(set(options) - set(_IGNORED) - set(_REFUSED) - set(_OPTIONS[key]))
    if unknown:
        raise ValueError(f"embedding tables on parameter servers do not know the "
                         f"{name} options {unknown} (known: {sorted(_OPTIONS[key])})")
    return _CLASSES[key](**{k: options[k] for k in _OPTIONS[key] if k in options})
