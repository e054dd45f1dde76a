"""What the tests share: server and emulator launchers, clients, stream rules, GGUF builders."""
