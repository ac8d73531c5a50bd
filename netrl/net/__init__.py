"""ZeroMQ plumbing: sockets, liveness and reconnects, a role's network thread, CURVE keys.

Internal, apart from three functions of :mod:`netrl.net.keys` that a library user needs to
run the roles with CURVE: ``keygen`` writes the keys, ``server_keys`` and ``client_keys``
load them for ``Server(keys=...)``, ``Trainer(keys=...)`` and ``RolloutWorker(keys=...)``
(see docs/security.md)."""
