"""ZeroMQ plumbing: sockets, liveness and reconnects, a role's network thread, CURVE keys.

Internal: the roles use it; user code should not need it."""
