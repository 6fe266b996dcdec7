"""Caller authentication: MultiversX native-auth tokens (`gasless.auth.native_auth`)."""
