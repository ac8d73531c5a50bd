"""Replay memories: tmrl's MemoryDataloading contract, the default ReplayMemory, and memories that rebuild
observations from earlier rows (frame stacks, rtgym action buffers)."""
