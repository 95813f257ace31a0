"""Independent float64 numpy oracles for per-sample norms and penalties."""

import numpy as np


def rows64(tree_leaves):
    """Concatenate leaves (B, ...) into one (B, D) float64 array."""
    batch = tree_leaves[0].shape[0]
    return np.concatenate(
        [np.asarray(leaf, np.float64).reshape(batch, -1) for leaf in tree_leaves], axis=1
    )


def norms64(tree_leaves):
    return np.sqrt(np.sum(rows64(tree_leaves) ** 2, axis=1))


def penalties64(norms, kind, target):
    if kind == "wgan-gp":
        return (norms / target - 1.0) ** 2
    if kind == "wgan-lp":
        return np.maximum(0.0, norms / target - 1.0) ** 2
    if kind == "r1":
        return norms**2
    raise ValueError(kind)
