"""Ready-made pipelines: the classes a worker and a trainer must agree on, built from config."""
