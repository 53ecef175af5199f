"""The demo session: seeded synthetic runs with planted differences, shared by the demo, tests and benchmarks."""
