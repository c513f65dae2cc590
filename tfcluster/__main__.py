"""``python -m tfcluster`` is the ``tfcluster`` command."""

import sys

from .cli import main

sys.exit(main())
