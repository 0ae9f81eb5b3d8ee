"""observability layer."""
