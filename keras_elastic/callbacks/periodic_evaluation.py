"""Step-based evaluation: evaluate every N model versions while training goes on.

ElasticDL's `--evaluation_steps`: the parameter servers' model version counts
updates of the whole job (all workers). Each time it crosses a multiple of
`every_n_versions`, the worker that sees it starts evaluation round
`version // every_n_versions`; other workers join that round when they cross
it too, and share its tasks. Metric states are summed exactly as in
`model.evaluate`, so a round's result is exact for the weights each task was
evaluated with; training goes on meanwhile, so (as in ElasticDL) tasks of one
round may see slightly different weights. Use `validation_data=` of `fit` for
evaluation on one consistent model after each epoch.
"""

from __future__ import annotations

import keras
from absl import logging

from keras_elastic.worker.session import session_of


class PeriodicEvaluation(keras.callbacks.Callback):
    """Evaluates an `ElasticDataset` every `every_n_versions` model versions.

    Args:
        validation_data: a `keras_elastic.ElasticDataset` in "evaluation" mode
            (give it its own `name`).
        every_n_versions: evaluate when the model version crosses a multiple of
            this.
        verbose: print the results.

    After training, `history` holds `(round, version, logs)` for each round
    this worker took part in.

    Example:

    ```python
    evaluator = ke.callbacks.PeriodicEvaluation(
        ke.ElasticDataset(val_files, dataset_fn=parse, mode="evaluation",
                          name="periodic"), every_n_versions=200)
    model.fit(train, epochs=5, callbacks=[evaluator])
    print(evaluator.history[-1])
    ```
    """

    def __init__(self, validation_data, every_n_versions: int, verbose: int = 1) -> None:
        super().__init__()
        from keras_elastic.dataset import ElasticDataset

        if not isinstance(validation_data, ElasticDataset) or (
                validation_data.mode != "evaluation"):
            raise ValueError("PeriodicEvaluation needs an ElasticDataset in "
                             "'evaluation' mode")
        if every_n_versions < 1:
            raise ValueError(f"every_n_versions must be >= 1, got {every_n_versions}")
        self.validation_data = validation_data
        self.every_n_versions = every_n_versions
        self.verbose = verbose
        self.history: list[tuple[int, int, dict[str, float]]] = []
        self._last_round = 0

    def _version(self) -> int:
        session = session_of(self.model)
        if session is None or not session.connected:
            raise ValueError("PeriodicEvaluation works with keras_elastic models "
                             "(ke.Model, ke.Sequential, ke.wrap) trained on an "
                             "ElasticDataset")
        return session.model_version()

    def on_train_batch_end(self, batch, logs=None):
        version = self._version()
        eval_round = version // self.every_n_versions
        if eval_round <= self._last_round:
            return
        self._last_round = eval_round
        from keras_elastic.worker.metric_states import (
            assign_states,
            metric_variables,
            read_states,
        )

        # Evaluation resets the metrics; keep the epoch's training metrics.
        variables = metric_variables(self.model)
        training_states = read_states(variables)
        try:
            results = session_of(self.model).evaluate_round(
                self.validation_data, eval_round=eval_round)
        finally:
            assign_states(variables, training_states)
        self.history.append((eval_round, version, results))
        if self.verbose:
            text = " - ".join(f"{k}: {v:.4f}" for k, v in results.items())
            logging.info("evaluation round %d (model version %d): %s", eval_round,
                         version, text)
