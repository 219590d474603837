"""Layer 4, over the runtime: compile / compile_file / load_binary, Program, and cuforge.jit."""
