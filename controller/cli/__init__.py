"""The `respawn` command: its commands (main) and its logs view (joblogs); what it draws is in controller.render."""
