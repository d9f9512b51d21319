"""Component paths, and matching a `components` nest to a dataset's element.

A *path* is a tuple of keys (dict keys, sequence indices) from the element's
root to one of its parts. It is shown to people as `features/tokens` (dict
keys), `[1]` (tuple indices) or a mix such as `features[0]`, and `<element>`
for the root itself.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any

Path = tuple[Any, ...]


def path_str(path: Path) -> str:
    """Returns a readable name for `path`, such as `features/tokens` or `[1]`."""
    if not path:
        return "<element>"
    text = ""
    for key in path:
        if isinstance(key, int):
            text += f"[{key}]"
        else:
            text += f"/{key}" if text else str(key)
    return text


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def children(value: Any) -> list[tuple[Any, Any]] | None:
    """Returns `(key, child)` pairs in `tf.nest` order, or None for a leaf."""
    if isinstance(value, collections.abc.Mapping):
        return [(key, value[key]) for key in sorted(value)]
    if _is_namedtuple(value):
        return list(zip(value._fields, value, strict=True))
    if isinstance(value, (tuple, list)):
        return list(enumerate(value))
    return None


def _kind_name(value: Any) -> str:
    if isinstance(value, collections.abc.Mapping):
        return f"a dict with keys {sorted(value, key=str)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a single component ({type(value).__name__})"


def leaves_with_paths(structure: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
    """Returns `(path, leaf)` for every leaf of `structure`, in `tf.nest` order."""
    kids = children(structure)
    if kids is None:
        return [(prefix, structure)]
    out: list[tuple[Path, Any]] = []
    for key, child in kids:
        out.extend(leaves_with_paths(child, prefix + (key,)))
    return out


def get_at(structure: Any, path: Path) -> Any:
    """Returns the part of `structure` at `path`."""
    for key in path:
        if _is_namedtuple(structure) and isinstance(key, str):
            structure = getattr(structure, key)
        else:
            structure = structure[key]
    return structure


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One leaf of the `components` nest: its path and the element part it covers."""

    path: Path
    reducer: Any
    spec: Any  # the element_spec part at `path` (a TypeSpec or a nest of them)


def assign(components: Any, element_spec: Any, is_leaf) -> list[Assignment]:
    """Matches `components` (a prefix of the element structure) to `element_spec`.

    Args:
      components: a nest whose leaves satisfy `is_leaf`. It must have the
        element's structure down to its own leaves; a leaf may stand for a
        whole sub-nest of the element.
      element_spec: the dataset's `element_spec`.
      is_leaf: tells whether a `components` node is a leaf (a reducer or None).

    Returns:
      One `Assignment` per leaf of `components`, in `tf.nest` order.

    Raises:
      ValueError: naming the path where the two structures differ.
      TypeError: naming the path of a `components` leaf that is not a reducer.
    """
    out: list[Assignment] = []

    def walk(comp: Any, spec: Any, path: Path) -> None:
        if is_leaf(comp):
            out.append(Assignment(path, comp, spec))
            return
        comp_kids = children(comp)
        if comp_kids is None:
            hint = (" (to use your own function, wrap it with "
                    "ke.batching.reducer(init_fn, reduce_fn, finalize_fn))"
                    if callable(comp) else "")
            raise TypeError(
                f"components at `{path_str(path)}` must be a ke.batching reducer, "
                f"None, or a nest of them, but got {comp!r}{hint}.")
        spec_kids = children(spec)
        if spec_kids is None:
            raise ValueError(
                f"components does not match the element structure at "
                f"`{path_str(path)}`: components has {_kind_name(comp)} there but "
                f"the element has a single component "
                f"({type(spec).__name__}).")
        comp_is_map = isinstance(comp, collections.abc.Mapping)
        spec_is_map = isinstance(spec, collections.abc.Mapping)
        comp_keys = [k for k, _ in comp_kids]
        spec_keys = [k for k, _ in spec_kids]
        if comp_is_map != spec_is_map or comp_keys != spec_keys:
            raise ValueError(
                f"components does not match the element structure at "
                f"`{path_str(path)}`: components has {_kind_name(comp)} but the "
                f"element has {_kind_name(spec)}.")
        for (key, comp_child), (_, spec_child) in zip(comp_kids, spec_kids,
                                                      strict=True):
            walk(comp_child, spec_child, path + (key,))

    walk(components, element_spec, ())
    return out
