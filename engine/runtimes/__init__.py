"""Runtimes: what runs a guest (WASM under wasmtime, JS in a QuickJS sandbox), one folder
each, behind the interfaces of `engine.runtimes.api`; the kinds of components and their
registry are `engine.runtimes.kinds`."""
