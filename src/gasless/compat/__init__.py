"""The starter-kit compatibility facade (unversioned, frozen): `/health`, `/relayer/address/{user}`, `/relay`."""
