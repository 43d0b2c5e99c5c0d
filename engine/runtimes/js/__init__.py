"""The JavaScript runtime: activities and workflows in a QuickJS sandbox (itself WASM)."""
