"""``python -m fastgp.train.cli ARGS``: the ``fastgp`` command."""

import sys

from fastgp.train.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
