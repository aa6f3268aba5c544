"""The embedded reference host: a CPU test double of an SGLang DFlash server."""
