"""``python -m tests.chaos [--runs 1000] [--seed S] [--steps N] [-v]``: see ``tests/chaos/sim.py``."""

import sys

from tests.chaos.sim import main

sys.exit(main())
