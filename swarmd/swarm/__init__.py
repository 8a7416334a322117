"""The collaboration layer over hivemind: DHT, optimizer, averaging records, child processes."""
