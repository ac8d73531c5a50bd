"""Configuration: the sections of config.json as frozen dataclasses, how they are loaded, checked and built."""
