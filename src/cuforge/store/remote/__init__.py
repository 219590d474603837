"""Remote cache tiers: shared between machines. See :mod:`cuforge.store.remote.base`."""
