"""Pure, sans-I/O protocol code: no asyncio, subprocess, os, sqlite or fastapi here."""
