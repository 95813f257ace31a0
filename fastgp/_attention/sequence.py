"""Sequence parallelism: attention whose token axis is split over mesh axes.

    in_shard_map(q, k, v, key_mask, axes, *, scheme, layout, **options)   inside shard_map
    explicit(q, k, v, key_mask, *, scheme, layout, **options)   explicit axes, tokens sharded

Three schemes, each exact to every order, and ``"auto"`` (the default), which takes the
all-to-all where each device's heads are a multiple of n and the ring otherwise (the all-to-all
holds the less memory per device: docs/performance.md). With the tokens over several mesh axes,
``"auto"`` where the heads do not split over all of them trades the last axes they split over
and runs the ring over the others (``_all_to_all`` with a ring; not with the zigzag layout):

* ``"ring"``: every pass runs as n steps that pass the key and value blocks around
  the devices (``fastgp._attention.ring``); a device holds its own tokens, the block it works on
  and the block in flight, so attention's memory per device falls with n, though not as 1/n:
  the blocks and the key-side sums are its own state (docs/performance.md). The tokens'
  ``layout`` is "contiguous" or, for causal masking with the work balanced, "zigzag"
  (``to_zigzag``).
* ``"all-to-all"`` (DeepSpeed-Ulysses): an all-to-all trades the token split for a head split,
  each device attends every token of H / n heads with one device's attention, and a second
  all-to-all trades back (the key mask is gathered). All-to-all is linear, its transpose the
  all-to-all back, so every derivative follows; memory per device falls as 1/n. The heads on
  each device must be a multiple of n. Either layout: the zigzag order is undone after the first
  all-to-all and redone before the second.
* ``"all-gather"``: each device keeps its own queries and gathers every device's keys, values
  and key mask along the token axis (as context parallelism does). The gather is differentiable
  to every order (its transpose is a reduce-scatter), and the per-device attention is
  ``padded.attend``. Causal masking: softmax does not depend on the order of the keys, so each
  device rolls the gathered keys until its own shard is last; its queries then sit at the static
  offset T - T_local among them, the earlier shards' keys are all visible, and the later shards'
  keys are masked out through the key mask. Contiguous layout only.
"""

from collections.abc import Sequence
from typing import TypedDict, Unpack

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp._attention.config import SCHEMES, Scheme, heads_do_not_split, heads_split
from fastgp._attention.padded import attend, shared_heads
from fastgp._attention.ring import LAYOUTS, Layout, Ring
from fastgp._attention.sharding import check_vma_for
from fastgp._attention.trade import gathered_tokens, to_heads, to_tokens
from fastgp._attention.zigzag import from_zigzag, to_zigzag
from fastgp._sharding import axes_of, collective_axis, mesh_of, spec_of
from fastgp._typing import Backend
from fastgp.distributed import varying_axes


class Options(TypedDict):
    """``padded.attend``'s keywords that every device passes on as they are."""

    scale: float
    backend: Backend


def _check_varying(arrays: Sequence[tuple[str, jax.Array]], axes: tuple[str, ...]) -> None:
    """Each array must vary over ``axes``, when any does (under ``shard_map(check_vma=False)``
    no array carries its varying axes, and nothing can be checked)."""
    if not any(set(axes) & varying_axes(x) for _, x in arrays):
        return
    for name, x in arrays:
        missing = tuple(sorted(set(axes) - varying_axes(x)))
        if missing:
            raise ValueError(
                f"fastgp.attention(sample_axis_name={axes!r}): {name} is the same on every "
                f"device of the mesh axes {missing}, but with sample_axis_name each device must "
                f"hold its own slice of the tokens. Pass each device's slice, or leave "
                f"sample_axis_name unset for attention over tokens that are not split."
            )


def _refuse_generic_interpret(backend: str, q: jax.Array) -> None:
    """Generic interpret mode on split tokens inside ``shard_map(check_vma=True)``: a fastgp
    error where JAX 0.10.2's interpreter mixes manual axis types and fails (ring or gather)."""
    if backend == "interpret" and varying_axes(q):
        raise ValueError(
            "fastgp.attention(backend='interpret', sample_axis_name=...) cannot run inside "
            "shard_map(check_vma=True): Pallas's interpret mode mixes manual axis types on the "
            "keys of other devices (JAX 0.10.2). Run that shard_map with check_vma=False, or "
            "use backend='xla'."
        )


def in_shard_map(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array | None,
    axes: tuple[str, ...],
    *,
    causal: bool,
    scheme: Scheme = "auto",
    layout: Layout = "contiguous",
    **options: Unpack[Options],
) -> jax.Array:
    """Inside shard_map: q, k, v (B, T_local, H, D) and key_mask (B, T_local) or None are this
    device's slice of the tokens, split over ``axes`` (in ``layout``); returns this device's
    (B, T_local, H, Dv). ``scheme``: "auto", "ring", "all-to-all" or "all-gather" (module);
    ValueError where the scheme does not suit the arrays (all-to-all: H a multiple of n)."""
    arrays = [("q", q), ("k", k), ("v", v)]
    _check_varying([*arrays, *([("the key mask", key_mask)] if key_mask is not None else [])], axes)
    _refuse_generic_interpret(options["backend"], q)
    axis = collective_axis(axes)
    shards = lax.axis_size(axis)
    check_known(scheme, layout)
    traded: tuple[str, ...] = ()
    if scheme == "auto":
        scheme = "all-to-all" if heads_split(q.shape[2], shards) else "ring"
        if scheme == "ring" and not (causal and layout == "zigzag"):
            traded = _traded_axes(axes, q.shape[2])
    _check_layout(q, k, causal, scheme, layout, shards)
    if key_mask is None:
        key_mask = jnp.ones(k.shape[:2], bool)
    if shards == 1:  # every token here: one device's attention (either layout)
        return attend(q, k, v, key_mask, causal=causal, **options)
    if traded:  # the all-to-all over the traded axes, the ring over the others inside it
        ring_axes = axes[: len(axes) - len(traded)]
        ring = Ring(ring_axes, lax.axis_size(collective_axis(ring_axes)), "contiguous")
        n = lax.axis_size(collective_axis(traded))
        return _all_to_all(q, k, v, key_mask, traded, n, causal, "contiguous", options, ring)
    if scheme == "ring":
        ring = Ring(axes, shards, layout if causal else "contiguous")
        return attend(q, k, v, key_mask, causal=causal, ring=ring, **options)
    if scheme == "all-to-all":
        return _all_to_all(q, k, v, key_mask, axes, shards, causal, layout, options)
    k_all, v_all, mask_all = (gathered_tokens(x, axes) for x in (k, v, key_mask))
    if not causal:
        return attend(q, k_all, v_all, mask_all, causal=False, **options)
    t_local, t_all = q.shape[1], k_all.shape[1]
    index = lax.axis_index(axis)
    position = jnp.arange(t_all)
    mask_all = mask_all & (position < (index + 1) * t_local)[None]  # later shards hidden
    shift = t_all - (index + 1) * t_local  # the own shard moves to the end
    k_all, v_all, mask_all = (jnp.roll(x, shift, axis=1) for x in (k_all, v_all, mask_all))
    return attend(q, k_all, v_all, mask_all, causal=True, q_offset=t_all - t_local, **options)


def _all_to_all(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    axes: tuple[str, ...],
    shards: int,
    causal: bool,
    layout: Layout,
    options: Options,
    ring: Ring | None = None,
) -> jax.Array:
    """The all-to-all scheme (see the module) over the ``shards`` devices of ``axes``:
    (B, T_local, H, D) -> (B, T, H / n, D), one device's attention, and back to
    (B, T_local, H, Dv). Grouped-query k and v trade their K heads where n divides K (each
    device then holds the key heads its query heads read), else H repeated ones. With ``ring``
    (over the token axes before ``axes``, contiguous layout) the attention between the trades
    runs on that ring: an all-to-all-then-ring split, as unified sequence parallelism does. The
    traded axes being the last, each ring step holds a contiguous run of the sequence, and
    causal masking is the contiguous ring's."""
    reorder = causal and layout == "zigzag"  # the keys' order is free where nothing is causal

    def on_heads(x: jax.Array) -> jax.Array:
        x = to_heads(x, axes, tokens_at=1, heads_at=2)
        return from_zigzag(x, shards) if reorder else x

    def on_tokens(x: jax.Array) -> jax.Array:
        x = to_zigzag(x, shards) if reorder else x
        return to_tokens(x, axes, tokens_at=1, heads_at=2)

    if not heads_split(k.shape[2], shards):  # grouped key heads that do not split: repeated
        k, v = shared_heads(k, v, q.shape[2])
    mask_all = gathered_tokens(key_mask, axes)
    mask_all = from_zigzag(mask_all, shards) if reorder else mask_all
    o = attend(on_heads(q), on_heads(k), on_heads(v), mask_all, causal=causal, ring=ring, **options)
    return on_tokens(o)


def _traded_axes(axes: tuple[str, ...], heads: int) -> tuple[str, ...]:
    """The longest run of the token axes' last axes, not all of them, whose devices divide each
    device's ``heads``: the all-to-all's part of an all-to-all-then-ring split (none: ())."""
    for first in range(1, len(axes)):
        if heads_split(heads, lax.axis_size(collective_axis(axes[first:]))):
            return axes[first:]
    return ()


def _check_layout(
    q: jax.Array, k: jax.Array, causal: bool, scheme: str, layout: str, shards: int
) -> None:
    """The local token and head counts suit the scheme and layout."""
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(
            f"fastgp.attention(is_causal=True, sample_axis_name=...): each device must hold as "
            f"many queries as keys, got {q.shape[1]} and {k.shape[1]}"
        )
    if scheme == "all-to-all" and not heads_split(q.shape[2], shards):
        raise heads_do_not_split(q.shape[2], shards)
    if layout == "zigzag" and causal:
        if scheme == "all-gather":
            raise ValueError(
                "fastgp.attention: sequence_layout='zigzag' runs on the ring or the all-to-all; "
                "pass sequence_parallel='ring' or 'all-to-all', or the contiguous layout"
            )
        if q.shape[1] % 2:
            raise ValueError(
                f"fastgp.attention(sequence_layout='zigzag'): each device holds two chunks of the "
                f"sequence, so its token count must be even, got {q.shape[1]} (the sequence "
                f"length must be a multiple of 2 x {shards} devices)"
            )


def check_known(scheme: str, layout: str) -> None:
    """ValueError naming the keyword of an unknown scheme or layout."""
    if scheme not in SCHEMES:
        raise ValueError(f"fastgp.attention: sequence_parallel={scheme!r} is not one of {SCHEMES}")
    if layout not in LAYOUTS:
        raise ValueError(f"fastgp.attention: sequence_layout={layout!r} is not one of {LAYOUTS}")


def token_axes(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[str, ...]:
    """Under explicit axes, the mesh axes q's token axis is split over (ValueError when q, k and
    v are split differently along it or along the features)."""
    specs = [spec_of(x) for x in (q, k, v)]
    tokens = {spec[1] for spec in specs}
    if len(tokens) != 1:
        raise ValueError(
            f"fastgp.attention: q, k and v must split their token axis alike, got the token "
            f"shardings {[spec[1] for spec in specs]}; reshard k and v like q"
        )
    for name, spec in zip("qkv", specs, strict=True):
        if spec[3] is not None:
            raise ValueError(
                f"fastgp.attention: {name}'s feature axis is sharded ({P(*spec)}); it must be "
                f"whole on each device. Reshard it, e.g. over the heads axis instead."
            )
    return axes_of(specs[0][1])


def explicit(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array | None,
    *,
    causal: bool,
    scheme: Scheme = "auto",
    layout: Layout = "contiguous",
    **options: Unpack[Options],
) -> jax.Array:
    """Explicit axes, q's token axis sharded: a shard_map over the arrays' mesh, batch and heads
    as they are sharded, the tokens by :func:`in_shard_map`."""
    axes = token_axes(q, k, v)
    batch, _, heads, _ = spec_of(q)
    specs = [P(batch, spec_of(x)[1], heads, None) for x in (q, k, v)]
    mask_spec = P(batch, spec_of(q)[1])
    mesh = mesh_of(q)
    args: tuple[jax.Array, ...] = tuple(
        jax.sharding.reshard(x, NamedSharding(mesh, s))
        for x, s in zip((q, k, v), specs, strict=True)
    )

    def local(q: jax.Array, k: jax.Array, v: jax.Array, *mask: jax.Array) -> jax.Array:
        return in_shard_map(
            q,
            k,
            v,
            mask[0] if mask else None,
            axes,
            causal=causal,
            scheme=scheme,
            layout=layout,
            **options,
        )

    in_specs = tuple(specs) + ((mask_spec,) if key_mask is not None else ())
    if key_mask is not None:
        args = (*args, jax.sharding.reshard(key_mask, NamedSharding(mesh, mask_spec)))
    run = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=specs[0],
        check_vma=check_vma_for(options["backend"]),
    )
    return run(*args)


__all__ = ["SCHEMES", "Scheme", "check_known", "explicit", "in_shard_map", "token_axes"]
