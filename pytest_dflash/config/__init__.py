"""Configuration: every option and ini key, host profiles (typed tables), durations."""
