"""Helpers and data for the agent tests: temporary host roots with a package copied in, as a pod has it."""
