"""``python -m minipaged`` is the same as the ``minipaged`` command."""

import sys

from minipaged.kit.cli import main

sys.exit(main())
