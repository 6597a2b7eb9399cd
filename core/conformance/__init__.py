"""The conformance suites: one per kind of backend a plugin can provide (journal, page
store, stream store, large-message store, queue type, full policy, protocol).

Each module holds a test class that a backend's own tests subclass, giving it the
fixtures that build the backend; every built-in backend runs them, and a third-party one
runs them the same way (`docs/plugins.md`, "Testing a plugin"). The broker fixtures
they use live in `scow.core.testing`.
"""
