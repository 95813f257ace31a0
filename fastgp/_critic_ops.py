"""Errors that name a critic op the penalty's second order cannot differentiate, and the ways out.

JAX reports such an op from deep inside its autodiff (``Differentiation rule for 'custom_lin' not
implemented`` for a ``custom_vjp`` op under forward mode, ``Higher-order AD not supported`` for a
fused kernel's backward). :func:`naming_first_order_only_ops` re-raises those as
:class:`FirstOrderOnlyOpError`, which says what the op lacks and what to use instead.
"""

import contextlib
from collections.abc import Iterator

# Substrings of the NotImplementedError messages JAX raises for each missing rule.
_NO_FORWARD_MODE = ("custom_lin", "forward-mode differentiation rule")
_NO_DOUBLE_BACKWARD = ("Higher-order AD not supported", "Transpose rule (for reverse-mode")


class FirstOrderOnlyOpError(NotImplementedError):
    """The critic holds an op without the derivative the penalty's second order needs."""


def _ways_out(second_order: str) -> str:
    other = (
        "second_order='reverse' (nested reverse mode), where that op's backward is itself "
        "differentiable (a custom_vjp whose bwd is plain jnp); "
        if second_order != "reverse"
        else ""
    )
    return (
        f"Ways out: {other}fastgp.attention in place of a fused attention kernel (every "
        "derivative of it is defined, blockwise); or fastgp.approximate_r1, a finite-difference "
        "R1/R2 penalty that needs first-order reverse mode only."
    )


@contextlib.contextmanager
def naming_first_order_only_ops(second_order: str) -> Iterator[None]:
    """Re-raise JAX's missing-derivative errors from inside the critic as FirstOrderOnlyOpError."""
    try:
        yield
    except NotImplementedError as err:
        message = str(err)
        if any(s in message for s in _NO_FORWARD_MODE):
            lacks = (
                "an op without forward mode (a jax.custom_vjp function or a fused kernel), so "
                f"second_order={second_order!r} cannot take its JVP"
            )
        elif any(s in message for s in _NO_DOUBLE_BACKWARD):
            lacks = (
                "an op whose backward cannot be differentiated (a fused kernel's backward, a "
                "pallas_call with no transpose rule), so no second order can be taken through it"
            )
        else:
            raise
        raise FirstOrderOnlyOpError(
            f"The critic holds {lacks}. {_ways_out(second_order)} (JAX: {message})"
        ) from err
