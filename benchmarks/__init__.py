"""Sections of scripts/bench.py."""
