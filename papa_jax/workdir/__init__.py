"""A workdir: its paths, binding and provenance, resuming, inputs by content, local or object
storage, the lease, probe checkpoints."""
