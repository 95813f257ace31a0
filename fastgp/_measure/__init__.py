"""The measuring tools behind ``fastgp.measure``, ``fastgp.autotune`` and ``fastgp.testing``.

    compiled.py    figures of a program compiled for a TPU generation from any host
    timing.py      interleaved wall-clock timing of several calls
    comparison.py  errors relative to a reference's largest entry

Private: ``fastgp.measure`` is their public face.
"""
