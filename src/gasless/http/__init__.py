"""The HTTP platform every route shares: problem documents, the OpenAPI document, the wire formats (ranges,
patterns), JSON body parsing, HEAD, pages and cursors, HTTP caching, the body limit and the Idempotency-Key
layer."""
