"""gasless: the gasless relaying service for MultiversX."""

__version__ = "0.1.0"
