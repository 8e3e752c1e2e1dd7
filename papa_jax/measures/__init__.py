"""What an attention matrix is made into: effective attention, context mixing, attention flow,
agreement between per-head scores."""
