"""Evidence for failures: log tails and state, the diagnosis catalog, redaction."""
