"""Agents: named, versioned definitions that runs are started from (G18)."""
