"""Developer tools (not part of the library)."""
