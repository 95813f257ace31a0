"""Comparing results against a reference, relative to the reference's largest entry: the one
yardstick of ``fastgp.testing`` and ``fastgp.autotune``.

    host_leaves(tree)                       -> the leaves as float64 numpy arrays
    reference_scale(ref_leaves, what)       -> the largest |entry|; ValueError if none can serve
    relative_errors(ours, ref, scale, ...)  -> per leaf max |ours - ref| / scale (inf: not finite)

Relative to the largest |entry| of the whole reference, so that entries near zero, or a leaf the
penalty does not depend on, do not dominate.
"""

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def host_leaves(tree: Any) -> list[np.ndarray]:
    """Every leaf of ``tree`` as a float64 numpy array on the host."""
    return [np.asarray(leaf, np.float64) for leaf in jax.tree.leaves(tree)]


def reference_scale(ref_leaves: Sequence[np.ndarray], what: str) -> float:
    """The largest |entry| of the reference; a ValueError if it is non-finite or all zero."""
    if not all(np.all(np.isfinite(leaf)) for leaf in ref_leaves):
        raise ValueError(
            f"the naive reference's {what} is not finite, so nothing can be compared (its "
            f"backward divides by each sample's input-gradient norm: NaN where one is zero); "
            f"choose arguments where no sample's input-gradient vanishes"
        )
    scale = max(float(np.max(np.abs(leaf), initial=0.0)) for leaf in ref_leaves)
    if scale == 0.0:
        raise ValueError(
            f"the naive reference's {what} is identically zero, so nothing is being compared; "
            f"choose arguments and a target where the penalty is active"
        )
    return scale


def relative_errors(
    ours: Sequence[np.ndarray], ref: Sequence[np.ndarray], scale: float, names: Sequence[str]
) -> list[float]:
    """Per leaf, max |ours - ref| / scale (inf where ours is not finite); an AssertionError
    naming the leaf when the shapes differ."""
    errors = []
    for a, b, name in zip(ours, ref, names, strict=True):
        if np.shape(a) != np.shape(b):
            raise AssertionError(
                f"the penalty's {name} has shape {np.shape(a)}; the reference's has {np.shape(b)}"
            )
        finite = np.all(np.isfinite(a))
        errors.append(float(np.max(np.abs(a - b), initial=0.0)) / scale if finite else math.inf)
    return errors


__all__ = ["host_leaves", "reference_scale", "relative_errors"]
