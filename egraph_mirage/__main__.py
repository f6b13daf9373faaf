"""``python -m egraph_mirage ...`` is the ``egraph-mirage`` command."""

import sys

from .cli import main

sys.exit(main())
