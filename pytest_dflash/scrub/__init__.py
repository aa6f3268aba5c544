"""Scrubbing every text that leaves the process: secrets masked (redact.py), then sizes capped (bounds.py)."""
