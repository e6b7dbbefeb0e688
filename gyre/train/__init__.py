"""Training: GSPO with per-execution normalisation, streaming micro-steps, elastic cells.

Modules (each with one job; torch is imported only where a model is touched):

* ``config``      typed configs (TrainerConfig and its parts)
* ``rewards``     scores vs missing assessments, group advantages (pure python)
* ``objective``   the GSPO loss with capped token weights and a per-execution clip
* ``stats``       ObjectiveStats: loss counters and train/inference mismatch, summed or maxed
* ``groups``      trace files -> trajectory trees -> admissions -> a ready group
* ``buffer``      packing buffer: ready groups -> micro-step tasks, oldest version first
* ``tasks``       the claimable unit (a packed micro-step + advantages), JSON on the wire
* ``weights``     weight snapshots a joining satellite pulls (file / memory channels)
* ``comm``        prefix communicators {0..k-1}, built once; gradient reduce
* ``replica``     a model that turns micro-steps into accumulated gradients
* ``step``        the optimizer step (reduce, 1/E, clip, step, version + 1, checkpoint when due)
* ``trainer``     one ``gyre run`` cell's training state (replica; the core's optimizer, version)
* ``checkpoint``  HF safetensors weights + optimizer + version + data cursor
* ``cell``        one cell's plumbing (process group, prefix comms, store) for a process or Ray actor
* ``fsdp``        FSDP2 inside a cell (K cells x G ranks; tested on CPU/gloo, not on CUDA)
* ``demo``        the ``gyre train demo`` rig (local cells on synthetic groups), not ``gyre run``'s
* ``packed``      per-token log-probs of packed rows (owned by the trace package's author)

See docs/training.md.
"""
