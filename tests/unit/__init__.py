"""Pure units: one module at a time, no Flask app (llama.cpp's tokenizer and the Cloud Storage emulator where a unit needs them)."""
