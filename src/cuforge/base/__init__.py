"""Layer 1, the bottom: settings, archs, paths, errors, file writes, the cache-dir layout and trust rule, signing."""
