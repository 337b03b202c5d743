"""Framework tests: respawnkit's hooks in real PyTorch, transformers and Lightning runs (CPU, tiny models built
from config, no hub). They need those frameworks, which the project's lock does not hold: `make
test-frameworks` installs the pins and runs them. Plain `make test` does not collect them."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("RESPAWN_FRAMEWORKS") == "1" else ["test_*.py"]
