"""Keras callbacks of keras-elastic, importable as `keras_elastic.callbacks`."""
