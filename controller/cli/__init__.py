"""The `respawn` command: its commands (main), and what they render (status_view, report, joblogs)."""
