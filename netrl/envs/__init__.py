"""Environments: the Gymnasium wrapper and the checks run on every env, the image env, real-time step timing."""
