"""The operator console: a Textual app on top of the engine (embedded) or its REST API."""
