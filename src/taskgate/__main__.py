"""`python -m taskgate …`: the same CLI as the `taskgate` console script (and named so in its help)."""

import sys

from taskgate.entrypoints.cli import main

if __name__ == "__main__":
    sys.argv[0] = "taskgate"
    main()
