"""webhook layer."""
