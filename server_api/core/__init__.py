"""Settings, database, security, logging, metrics and request limits."""
