"""The approximate R1 penalty, first-order only (public face: ``fastgp.approximate_r1``).

api.py   approximate_r1: the finite-difference R1 of APT and AAPT (its oracle is exact R1,
         compared in tests/approximate and benchmarks/approximate_r1)
"""
