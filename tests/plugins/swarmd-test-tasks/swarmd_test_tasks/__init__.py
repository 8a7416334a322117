"""Test-only swarmd task plug-ins: toy-regression (the plug-in example; exact shards for the equivalence test),
faulty (fails on command), hang-test (a step that hangs while a file exists)."""
