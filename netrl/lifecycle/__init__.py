"""How netrl's roles live (internal): construct -> ``run(stop)`` -> ``close()`` once
(``runs``), tmrl's arguments they refuse (``tmrl_args``), and the torch threads they start
with (``torch_threads``)."""
