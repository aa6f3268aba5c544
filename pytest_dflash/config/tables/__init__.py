"""The tables of a host profile, one validator module each, and the TOML table reader they share."""
