"""Argument types of the ``fastgp`` command's flags: each parses one value and raises
``argparse.ArgumentTypeError`` naming it (argparse adds the flag).

    _positive_int, _non_negative_int, _int, _seed, _port  -> int
    _number(low, high=inf, open_low=False)                -> a parser of a finite float in range
"""

import argparse
import math
from collections.abc import Callable

from fastgp.train.training.state import INT32_MAX

SEED_MAX = 2**32 - 1  # the PRNG key holds 32 bits of the seed; larger seeds would alias


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    if value > INT32_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {INT32_MAX} (int32 counters), got {value}"
        )
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def _seed(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(
            f"must be an integer in 0..{SEED_MAX} (the random key holds 32 bits), got {value}"
        )
    return value


def _number(
    low: float, high: float = math.inf, *, open_low: bool = False
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (
            math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
        ):
            bound = f"> {low}" if open_low else f">= {low}"
            raise argparse.ArgumentTypeError(
                f"must be a finite number {bound}"
                + (f" and <= {high}" if high < math.inf else "")
                + f", got {text}"
            )
        return value

    return parse


def _port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..{INT32_MAX}, got {value}")
    return value
