"""The pure core: the spec, the status, what was observed, the planner and its transitions,
the policy, the ledger. No cloud library, no I/O, no clock read (tests/unit/test_layers.py)."""
