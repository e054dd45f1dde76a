"""Where the GGUF comes from: a path, Cloud Storage, the embedded default model."""
