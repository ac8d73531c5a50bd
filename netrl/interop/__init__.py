"""TorchRL interop: netrl batches, actors and agents in TorchRL's terms (the ``torchrl`` extra)."""
