"""Measuring tools: a program's figures compiled for a TPU from any host, wall-clock times compared
within one run, and the yardstick that ``fastgp.testing`` and ``fastgp.autotune`` compare with.

Compiled ahead of time (libtpu's compile-only client; ``jax[tpu]``, no TPU needed):

    tpu_device(generation)          -> a device of a small topology of that generation ("v5e")
    tpu_devices(topology)           -> every compile-only device of a topology ("v5p:2x2x2")
    lower_for(device, fn, *args)    -> the lowered program of ``jax.jit(fn)`` on that device
    compile_for(device, fn, *args)  -> the compiled program of ``jax.jit(fn)`` on that device
    figures(compiled)               -> dict: flops, bytes, copies, memory (peak, temp, ...),
                                       Mosaic kernels, while loops
    count_copies(hlo_text)          -> {"copy": n, "copy-start": m} outside fused computations
    transfers(hlo_text)             -> each collective-permute and what runs while it is in flight
    is_out_of_memory(error)         -> whether a compile failed for want of HBM
    roofline_s(figures, generation) -> max(flops / peak flops, bytes / HBM bandwidth), seconds
    CHIPS, TOPOLOGIES               each generation's peak figures, and its small topology

Timed on this machine:

    interleaved_times(calls, rounds=20, warmup=2) -> {name: [per-call seconds, one per round]},
                                       every call once a round in a rotating order, so that a
                                       shared machine's load falls on every call alike

Compared against a reference:

    host_leaves(tree)                       -> the leaves as float64 numpy arrays
    reference_scale(ref_leaves, what)       -> the reference's largest |entry|
    relative_errors(ours, ref, scale, ...)  -> per leaf max |ours - ref| / scale (inf: not finite)

Compare paths as ratios measured in one run (``interleaved_times``), or by the compiled figures of
one program against another's for the same chip; never a time against a fixed number.
"""

from fastgp._measure.comparison import host_leaves as host_leaves
from fastgp._measure.comparison import reference_scale as reference_scale
from fastgp._measure.comparison import relative_errors as relative_errors
from fastgp._measure.compiled import CHIPS as CHIPS
from fastgp._measure.compiled import TOPOLOGIES as TOPOLOGIES
from fastgp._measure.compiled import Chip as Chip
from fastgp._measure.compiled import Transfer as Transfer
from fastgp._measure.compiled import compile_for as compile_for
from fastgp._measure.compiled import count_copies as count_copies
from fastgp._measure.compiled import figures as figures
from fastgp._measure.compiled import is_out_of_memory as is_out_of_memory
from fastgp._measure.compiled import lower_for as lower_for
from fastgp._measure.compiled import roofline_s as roofline_s
from fastgp._measure.compiled import tpu_device as tpu_device
from fastgp._measure.compiled import tpu_devices as tpu_devices
from fastgp._measure.compiled import transfers as transfers
from fastgp._measure.timing import interleaved_times as interleaved_times

__all__ = [
    "CHIPS",
    "TOPOLOGIES",
    "Chip",
    "Transfer",
    "compile_for",
    "count_copies",
    "figures",
    "host_leaves",
    "interleaved_times",
    "is_out_of_memory",
    "lower_for",
    "reference_scale",
    "relative_errors",
    "roofline_s",
    "tpu_device",
    "tpu_devices",
    "transfers",
]
