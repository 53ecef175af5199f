"""What a test reads of a page's forms."""

from __future__ import annotations

import re


def hidden(html: str, name: str) -> str:
    """The value of the page's field `name` (a hidden input such as the sign-in form's `csrf_token`)."""
    match = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert match is not None, f"no {name} field in the page"
    return match.group(1)
