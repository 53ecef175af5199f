"""What a new user meets first and should not stumble on: the usage line names only what is missing, `--help` says
what an empty default means, the address a user guesses for the sessions list leads to it."""

from __future__ import annotations

from tests.support import loopback_http
from tests.support.cli_main import main_cli
from tests.support.servers import LiveServer


def test_compare_with_one_run_asks_for_the_candidate_only() -> None:
    result = main_cli("compare", "ref")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith("the following arguments are required: b")


def test_help_says_empty_for_an_empty_default() -> None:
    result = main_cli("--help")
    assert result.returncode == 0
    assert "(default )" not in result.stdout
    assert "TENSOR_DEBUGGER_DATABASE_URL (default empty)" in result.stdout


def test_the_sessions_address_leads_to_the_list(shared_server: LiveServer) -> None:
    answer = loopback_http.get(f"{shared_server.url}/sessions", headers=shared_server.auth, follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (301, "/")
    assert loopback_http.get(f"{shared_server.url}/sessions", follow_redirects=True).status_code == 200
