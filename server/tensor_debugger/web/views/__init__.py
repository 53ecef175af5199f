"""What the pages show, built from reports: one module per page."""
