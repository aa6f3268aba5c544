"""Evidence for failures: log tails and state, the diagnosis catalog, what each test report carries."""
