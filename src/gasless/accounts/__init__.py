"""Account mirrors: public reads of what the billing contract holds for an account."""
