"""Rate limits in one place: token buckets and the route-class table (`buckets`), their Redis backend shared
between hosts (`redis_backend`), route-class dependencies and the `RateLimit-*` headers (`route_classes`), and
the per-account rate-class and platform admission limits of the relay path (`accounts`)."""
