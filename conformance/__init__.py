"""specdiff's conformance harness: kernel contracts, strategies, the runner and reports."""
