"""Client-side helpers for callers of the service."""
