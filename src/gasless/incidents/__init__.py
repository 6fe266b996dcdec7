"""Incidents: public incidents with append-only updates, automatic ones raised by the service."""
