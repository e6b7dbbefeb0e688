"""The ``gyre train demo`` rig: K cells as local OS processes on synthetic groups.

Not what ``gyre run`` uses (that is :mod:`gyre.runtime.cell` over :mod:`gyre.train.trainer`);
this rig, its tests and the training benchmarks share the optimizer step
(:mod:`gyre.train.step`), the replica and the packing buffer with it.

* ``coordinator`` the claim queue + fixed-order membership (in-process, or any torch Store)
* ``core``        cell 0: optimizer, step loop over the coordinator, the step feeder
* ``satellite``   cells 1..K-1: join a running step, claim, reduce
* ``local``       run K cells as local processes (gloo on 127.0.0.1)
* ``participation`` who joined each step, and why a satellite missed one
* ``synthetic``   synthetic groups for the rig, tests and benchmarks

See docs/training.md, "The test rig: gyre train demo".
"""
