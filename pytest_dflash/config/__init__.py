"""Configuration: options and ini keys, the layers, host profiles, fleet inventories, durations, state
paths."""
