"""The parity layer: greedy token parity, distribution parity and accept length."""
