"""`python -m fsm`: the engine's scenario and review tools (see fsm/cli.py)."""

import sys

from .cli import main

sys.exit(main())
