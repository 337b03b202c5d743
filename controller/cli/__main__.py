"""`python -m controller.cli.main`: the `respawn` command."""

from controller.cli.main import app

app()
