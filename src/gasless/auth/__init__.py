"""Caller authentication: native-auth tokens, sponsor-key and role dependencies, origins, identity."""
