"""`python -m dualloop`: the same command line as the `dualloop` script."""

import sys

from dualloop.controller.cli import main

if __name__ == "__main__":
    sys.exit(main())
