"""Where the GGUF comes from (a path, Cloud Storage, the embedded default) and how far its load got."""
