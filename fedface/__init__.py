"""The `fedface` command line: one entry point over every FedFace component."""
