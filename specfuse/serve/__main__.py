"""`python -m specfuse.serve`: the serving command (cli.py).

Knows nothing of its own: it calls cli.main.
"""

import sys

from .cli import main

sys.exit(main())
