"""agent-bridge: run coding-agent CLIs and relay them to WebSocket and REST clients."""

__version__ = "0.1.0"
