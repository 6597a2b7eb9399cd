"""STOMP 1.2 for the Scow broker, a protocol plugin built on Scow's public API only."""
