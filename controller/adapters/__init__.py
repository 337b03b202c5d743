"""Adapters behind the ports: in-memory fakes here, Google clients beside them."""
