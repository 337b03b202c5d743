"""respawn: a serverless reconciliation controller for Spot training jobs on Compute Engine."""
