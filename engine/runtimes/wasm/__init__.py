"""The WebAssembly component runtime (wasmtime): activities and workflows."""
