"""``python -m cuforge ...``: the same as the ``cuforge`` command."""

import sys

from cuforge.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
