"""The only layer that joins an agent process to a codec."""
