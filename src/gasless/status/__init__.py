"""Public status: components, measured latency, relayer float labels, incidents, availability; the feeds
published for the separate status site."""
