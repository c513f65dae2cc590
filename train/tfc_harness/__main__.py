"""``python -m tfc_harness SETTINGS.json``: run a node from a settings file (for debugging by hand)."""

import json
import sys

from . import main

if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m tfc_harness SETTINGS.json", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as fh:
        sys.exit(main(json.load(fh)))
