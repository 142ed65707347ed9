"""HTTP layer: dependencies, error mapping and thin routes."""
