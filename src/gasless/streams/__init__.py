"""The account event stream (`GET /v1/stream`) and its single-use tickets (`POST /v1/stream/tickets`)."""
