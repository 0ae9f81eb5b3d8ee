"""plan layer."""
