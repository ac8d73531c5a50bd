"""Env runners: what steps a worker's envs (one env, a vector of envs) and the
sync-collection variant."""
