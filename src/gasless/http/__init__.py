"""The HTTP platform every route shares: problem documents, the OpenAPI document, pages and cursors,
HTTP caching, the body limit and the Idempotency-Key layer."""
