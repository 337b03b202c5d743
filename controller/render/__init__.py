"""What respawn draws, for the CLI and the local cloud's demo alike: plain text (text), the jobs table (status_view), the run report (report). Below both: it imports neither."""
