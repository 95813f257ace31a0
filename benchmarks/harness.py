"""What every study's command line shares.

parser(doc)  -> an ArgumentParser described by the first line of the study's docstring
"""

import argparse


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The study's parser: ``python -m benchmarks.<study> --help`` opens with the first line of
    its module docstring ``doc``."""
    return argparse.ArgumentParser(description=(doc or "").split("\n")[0])


__all__ = ["parser"]
