"""Helpers shared by several self-test folders (on sys.path through pytest's pythonpath = tests)."""
