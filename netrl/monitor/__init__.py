"""What a running system shows: round metrics (CSV and wandb), the server's status
snapshot, learning-curve plots.

Internal: the roles and the command line use it."""
