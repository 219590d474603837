"""Layer 5: cuforge under other systems' caches (Triton, CuPy, JAX, cuda.core)."""
