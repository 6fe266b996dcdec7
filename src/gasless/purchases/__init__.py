"""Purchases: the builders of unsigned contract calls (subscribe, deposit, flags, senders) and their stateless
quotes. The user signs what they build once and relays it like any other transaction."""
