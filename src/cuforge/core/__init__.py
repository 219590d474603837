"""Layer 3: the cache (Cache) and its one build protocol, the compile pipeline, blob builds, the fence, recording and prefetch."""
