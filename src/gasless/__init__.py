"""gasless: the gasless relaying service for MultiversX."""
