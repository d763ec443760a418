"""HTTP and WebSocket: the only place that knows FastAPI."""
