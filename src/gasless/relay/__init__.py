"""The relay core: assign + leases, relay checks, intents and their state machine, broadcaster, tracker."""
