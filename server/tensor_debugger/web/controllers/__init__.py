"""One controller per resource: sessions, runs and tensors under /api, and the HTML pages."""
