"""The cyclic garbage collector's thresholds in a function's process (CPython's: 700, 10, 10).

A pass allocates millions of short-lived objects (pages, views, actions) beside a cache of
hundreds of thousands that live for hours; at CPython's thresholds the collector ran every 700
allocations and, often, over the whole cache: 0.32 of the 1.04 CPU-s of a steady 2,000-job tick
(bench.deployed's fleet, the tick in one process, gc.callbacks timing each collection); at these,
0.04 of 0.81 to 0.85. Reference counting still frees nearly everything at once: only cycles wait
for a collection, and a young one still comes every 50,000 allocations.

``main`` sets them before it imports the controller, whose modules define hundreds of classes
(pydantic models, dataclasses): at CPython's thresholds, collections over them were about 0.03 of
the 0.27 CPU-s those imports cost a cold start (python -X importtime and time.process_time, this
repository's 2-CPU machine).
"""

import gc

THRESHOLDS = (50_000, 20, 100)


def tune() -> None:
    gc.set_threshold(*THRESHOLDS)
