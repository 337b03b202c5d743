"""The fleet simulator (``make sim``): respawn's real planner and executor against
baselines, over a week of simulated Spot preemptions and stockouts.

- ``sim.model``: parameters, the traces every policy shares, the analytic ceiling;
- ``sim.fleet``: the discrete-event world (VMs, trainers, checkpoints, zones) and the
  controllers: the real engine over the in-memory fakes, and the modelled baselines;
- ``sim.__main__``: the command line, the table, ``results.json`` and ``results.png``.

Goodput is useful training time over paid VM time: useful is the training seconds in the
newest complete checkpoint of each job at the end (work since it is not counted); paid is
every VM's RUNNING time: from its creation (boot included) to its preemption notice (it is
STOPPING from then) or its delete, whichever came first.
"""
