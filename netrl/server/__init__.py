"""The Server role: everything only the relay process runs. It never imports torch.

Internal apart from the role class, :class:`netrl.Server`."""
