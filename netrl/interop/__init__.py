"""Interop with other RL libraries (TorchRL): loaded only when used, never by the core."""
