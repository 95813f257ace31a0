"""Parsers of one flag value each, for the fields' declarations and the ``fastgp`` command: each
returns the value or raises ``argparse.ArgumentTypeError`` naming it (argparse adds the flag).

    positive_int, non_negative_int, integer, seed, port  -> int
    number(low, high=inf, open_low=False)                -> a parser of a finite float in range
"""

import argparse
import math
from collections.abc import Callable

INT32_MAX = 2**31 - 1  # iteration and optimiser step counters are int32
SEED_MAX = 2**32 - 1  # the PRNG key holds 32 bits of the seed; larger seeds would alias


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive_int(text: str) -> int:
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


def non_negative_int(text: str) -> int:
    value = integer(text)
    if not 0 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer in 0..{INT32_MAX}, got {value}")
    return value


def seed(text: str) -> int:
    value = integer(text)
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(
            f"must be an integer in 0..{SEED_MAX} (the random key holds 32 bits), got {value}"
        )
    return value


def port(text: str) -> int:
    value = integer(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in 1..65535, got {value}")
    return value


def number(low: float, high: float = math.inf, *, open_low: bool = False) -> Callable[[str], float]:
    """A parser of a finite float ``> low`` (``open_low``) or ``>= low``, and ``<= high``."""

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


__all__ = [
    "INT32_MAX",
    "SEED_MAX",
    "integer",
    "non_negative_int",
    "number",
    "port",
    "positive_int",
    "seed",
]
