"""`swarmd monitor`: a process that trains nothing, watches one run and keeps its model (cli/monitor.py)."""
