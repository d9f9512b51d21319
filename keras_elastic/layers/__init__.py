"""Keras layers whose state lives on the parameter servers.

May import: common. Of it `common/keras_compat.py` (TensorFlow and Keras
only); the worker connects a layer to the parameter servers
(`worker/table_lookup.py`).

`ke.layers.Embedding` is a drop-in for `keras.layers.Embedding` whose table is
partitioned by id over the parameter servers; `convert_embeddings` swaps the
`keras.layers.Embedding` layers of an existing model for it (`ke.wrap(model,
ps_embeddings_above=...)`).
"""

from keras_elastic.layers.embedding import Embedding, convert_embeddings, embedding_step

__all__ = ["Embedding", "convert_embeddings", "embedding_step"]
