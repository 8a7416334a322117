"""The training worker thread and what it measures."""
