"""The GPU kernels on a CUDA device: check.sh runs their tests and bandwidth.py."""
