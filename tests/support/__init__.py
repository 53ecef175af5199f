"""What the tests share: servers in child processes, polling, and builders of test inputs."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"  # screenshots of the pages
