"""TorchRL interop: TensorDict batches, TorchRL envs, policies and losses, netrl as a collector."""
