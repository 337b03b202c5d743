"""``respawn dashboard``: the fleet and each job in a browser, served from this machine.

The CLI's reads and verbs (``controller.service.jobs.Jobs``) behind a local web server
(``server``): pages rendered from templates, a little JavaScript that polls JSON, every
asset served by the server itself, and ``/metrics`` for Prometheus. Only the CLI imports
this package; the Cloud Functions never do (tests/unit/test_layers.py).
"""
