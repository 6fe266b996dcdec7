"""Sponsor API keys: format, storage (HMAC only), lifecycle routes and the lookup used by X-Api-Key."""
