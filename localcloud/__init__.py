"""A local Google Cloud for respawn: real protocol servers the real clients talk to.

GCS is fake-gcs-server (from PyPI); Compute Engine, the metadata server, Cloud
Scheduler and Eventarc are stand-ins written here. Fidelity is the point: where
Google documents a behaviour, these match it, and Compute requests are validated
against Google's own discovery document.
"""
