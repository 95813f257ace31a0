"""The pytest-benchmark suites (`make bench`) and their report (results/suites/bench.md)."""
