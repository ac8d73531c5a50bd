"""The wire contract, with no sockets: message types, the frame layout, codecs, the
sample schema and weight layouts.

Internal: the roles use it; user code should not need it."""
