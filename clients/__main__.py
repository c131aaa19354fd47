"""`python -m clients ...` is the same as the `ropeserve` command."""

import sys

from .cli import main

sys.exit(main())
