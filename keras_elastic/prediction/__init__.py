"""Prediction outputs: written once per task, read back in input order.

A prediction job's worker writes the outputs of each task when the task is
done, through a `PredictionWriter` (ElasticDL's PredictionOutputsProcessor
idea). The default, `NumpyWriter`, writes one `.npz` part per task to a
temporary name and renames it into place, so a task that is run again (its
first worker died) replaces its part and every record has exactly one output.
`read_predictions(output_dir)` puts them back together in input order.

May import: common.

Example:

```python
ds = ke.ElasticDataset("data/test-*.tfrecord", dataset_fn=parse,
                       mode="prediction", output_dir="preds/")
model.predict(ds)
predictions = ke.prediction.read_predictions("preds/")
```
"""

from keras_elastic.prediction.writer import (
    NumpyWriter,
    PredictionWriter,
    TaskRange,
    read_predictions,
)

__all__ = ["NumpyWriter", "PredictionWriter", "TaskRange", "read_predictions"]
