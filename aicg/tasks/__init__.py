"""The build: one instance as a graph of cached steps, run by doit."""
