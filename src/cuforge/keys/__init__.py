"""Layer 2: what a key is made of: digests, dependency scans, fingerprints, direct mode, miss explanations."""
