"""The await-graph engine: pure logic fed with poll events."""
