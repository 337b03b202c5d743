"""The deployed shape end to end: `respawn demo` as a user runs it (the README's first command)."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_survives_three_preemptions_with_the_uninterrupted_weights():
    result = subprocess.run([sys.executable, "-m", "controller.cli", "demo"], capture_output=True, text=True,
                            timeout=240, env={**os.environ, "COLUMNS": "200"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"outcome\s+│ SUCCEEDED", output)
    assert re.search(r"preemptions\s+│ 3", output)
    final = re.search(r"final weights\s+│ (\w+)", output)
    reference = re.search(r"uninterrupted run\s+│ (\w+)", output)
    assert final and reference and final.group(1) == reference.group(1)
    assert "preempting demo-1 hard" in output and "stockout in us-central1-a" in output
    assert "same weights as an uninterrupted run" in output
