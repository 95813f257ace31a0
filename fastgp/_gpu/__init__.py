"""What fastgp's GPU path needs beside its kernels (``fastgp.kernels.*.gpu``, Triton, Mosaic GPU).

    pallas.py    the Pallas GPU backends this JAX ships; the GPU kernels, imported on first use
    tuned.py     the kernels' launch settings per GPU, from fastgp/tuned/gpu.json
    lowering.py  tracing and lowering for an abstract GPU from a host with none

Private: the penalty's and attention's bindings and ``fastgp._backends`` import them.
"""
