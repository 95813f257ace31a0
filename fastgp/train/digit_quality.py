"""The digits metric (``fastgp.train.evaluation``'s ``DigitQuality``) under its documented name.

from fastgp.train.digit_quality import DigitQuality
metric = DigitQuality()   # splits the digits, fits the classifiers, measures the floors
metric(samples)           # (N, 8, 8, 1) or (N, 64) in [-1, 1], N >= 898 -> one dict
"""

from fastgp.train.evaluation import (
    FRECHET_SETS,
    NOISE_CURVE,
    NOISE_SIGMAS,
    PIXELS,
    DigitQuality,
    frechet,
    noise_sigma,
)

__all__ = [
    "DigitQuality",
    "FRECHET_SETS",
    "NOISE_CURVE",
    "NOISE_SIGMAS",
    "PIXELS",
    "frechet",
    "noise_sigma",
]
