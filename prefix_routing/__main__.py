"""``python -m prefix_routing``: the command line lives in :mod:`prefix_routing.cli`."""

import sys

from prefix_routing.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
