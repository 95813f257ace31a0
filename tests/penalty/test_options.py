"""The option tuples are the values of their ``Literal`` types: one source of truth for each."""

from typing import get_args

from fastgp import _typing
from fastgp._backends import BACKENDS
from fastgp._penalty.kinds import KINDS
from fastgp.penalty import REMAT_POLICIES, SECOND_ORDER


def test_option_tuples_are_their_literal_types():
    assert KINDS == get_args(_typing.Kind) == ("wgan-gp", "wgan-lp", "r1")
    assert BACKENDS == get_args(_typing.Backend)
    assert SECOND_ORDER == get_args(_typing.SecondOrder) == ("reverse-over-forward", "reverse")
    assert set(REMAT_POLICIES) == {None, *get_args(_typing.RematPolicy)}
    assert set(get_args(_typing.Remat)) == {_typing.RematPolicy, type(None)}
