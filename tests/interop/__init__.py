"""Tests of netrl.interop."""
