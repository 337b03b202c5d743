"""The imperative shell: observe, plan (the core), act; the engine, the functions, their
wiring and configuration, notification delivery."""
