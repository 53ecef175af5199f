"""The command line's arguments: every command, its options and its help."""

from __future__ import annotations

import argparse
from pathlib import Path

from tensor_debugger import __version__
from tensor_debugger.settings import setting_docs


def build_parser() -> argparse.ArgumentParser:
    settings_help = "\n".join(
        f"  {env} (default {default or 'empty'}): {help}" for env, default, help in setting_docs()
    )
    parser = argparse.ArgumentParser(
        prog="tensor-debugger",
        description="Find which tensor went wrong first between two runs of a model.",
        epilog="Environment variables:\n" + settings_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="data directory (default: TENSOR_DEBUGGER_DATA_DIR, else ~/.local/share/tensor-debugger)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="threads that compare and ingest (default: "
        "TENSOR_DEBUGGER_WORKERS, else 0: one per CPU this process may run on)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the web app and API")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--no-demo", action="store_true", help="do not create the demo session")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback address without a token: anyone who reaches it may read and delete everything",
    )

    ingest = commands.add_parser("ingest", help="add a run to a session (created if needed)")
    ingest.add_argument("--session", required=True, help="session name")
    ingest.add_argument("--run", required=True, help="run label, e.g. reference or candidate")
    ingest.add_argument("paths", nargs="+", type=Path, help="tensor files, archives or folders")
    ingest.add_argument(
        "--against",
        metavar="RUN",
        help="the label of the session's run to compare this run against (default: the session's reference)",
    )
    ingest.add_argument("--json", action="store_true", help="print one JSON object")
    ingest.add_argument(
        "--in-process",
        action="store_true",
        help="do the work in this process even when a server runs on the data dir (no warm path)",
    )
    _server_options(ingest)

    compare = commands.add_parser(
        "compare", help="ingest a reference run and candidates, compare them, print the first divergence"
    )
    compare.add_argument("a", type=Path, help="the reference run: a tensor file, an archive or a folder")
    compare.add_argument("b", type=Path, help="the candidate run")
    compare.add_argument(
        "more",
        nargs="*",
        type=Path,
        metavar="C",
        default=[],  # optional: without a default, argparse lists C among the missing when B is
        help="further candidate runs, each compared with the reference",
    )
    compare.add_argument("--name", help="session name (default: 'A vs B')")
    compare.add_argument("--rtol", type=float, help="relative tolerance (default: torch.testing's per dtype)")
    compare.add_argument("--atol", type=float, help="absolute tolerance (default: torch.testing's per dtype)")
    compare.add_argument(
        "--strategies",
        metavar="LIST",
        help="pairing strategies in the order tried, e.g. "
        "layer_stage,name,normalized,fuzzy:0.8,shape (default: layer_stage,name,module,parameter,key,"
        "normalized,fuzzy,shape)",
    )
    compare.add_argument(
        "--name-pattern",
        metavar="REGEX",
        help="a regex with named groups layer and stage "
        "(and optionally rank) that names match, e.g. 'L(?P<layer>\\d+)_(?P<stage>[a-z_]+)'",
    )
    compare.add_argument(
        "--dims",
        action="append",
        default=[],
        metavar="GLOB=NAMES",
        help="name the aligned dimensions of the tensors whose names match GLOB (repeatable), e.g. "
        "'*attn*=batch,heads,tokens,head_dim': `where` and the error profiles use the names (a glob applies where "
        "its names are as many as the dimensions)",
    )
    compare.add_argument(
        "--pairing",
        type=Path,
        metavar="FILE",
        help="a pairing file (JSON, as GET "
        "/api/sessions/{id}/pairing exports) to apply; --strategies, --name-pattern and --dims win over it",
    )
    compare.add_argument(
        "--verbose",
        action="store_true",
        help="say on stderr how the pairs were read: from the bytes as both runs were ingested, or read back from "
        "the store (and why)",
    )
    compare.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first divergence in execution order, once every pair before it is known (exit 1; "
        "the pairs after it are left uncompared)",
    )
    compare.add_argument(
        "--ulp",
        type=int,
        metavar="N",
        help="an element passes within N units in the last place of the pair's lower-precision dtype (instead of "
        "--rtol and --atol)",
    )
    compare.add_argument(
        "--top",
        type=int,
        metavar="K",
        help="keep each pair's K largest differences, 0 to 64 (default 8; TENSOR_DEBUGGER_TOP)",
    )
    compare.add_argument(
        "--noise",
        type=Path,
        metavar="A2",
        help="a rerun of the reference: each pair passes when the candidate's max |diff| is within "
        "--noise-factor times the rerun's at that tensor (its noise floor)",
    )
    compare.add_argument(
        "--noise-factor",
        type=float,
        metavar="K",
        help="how many times the noise floor a pair's error may be (default 4)",
    )
    compare.add_argument(
        "--allow-unmatched",
        action="append",
        default=[],
        metavar="GLOB",
        help="reference tensors whose names match may have no partner in the candidate (repeatable, e.g. "
        "'layers.[123].*'); any other reference tensor without partner makes the comparison incomplete (exit 1)",
    )
    compare.add_argument("--json", action="store_true", help="print one JSON object")
    compare.add_argument(
        "--in-process",
        action="store_true",
        help="do the work in this process even when a server runs on the data dir (no warm path)",
    )

    explore = commands.add_parser("explore", help="compare every tensor of one run with every other")
    explore.add_argument("path", type=Path, help="the run: a tensor file, an archive or a folder")
    explore.add_argument("--match", metavar="GLOB", help="only tensors whose names match (any case), e.g. '*attn*'")
    explore.add_argument("--name", help="session name (default: 'explore PATH')")
    explore.add_argument("--json", action="store_true", help="print one JSON object, as compare does")

    diff = commands.add_parser(
        "compare-sessions", help="two sessions' pairs matched by name: each one's error in both and the change"
    )
    diff.add_argument("s1", metavar="S1", help="the session before (its id or name)")
    diff.add_argument("s2", metavar="S2", help="the session after (its id or name)")
    diff.add_argument("--json", action="store_true", help="print one JSON object")

    sessions = commands.add_parser("sessions", help="list sessions and their runs")
    sessions.add_argument("--json", action="store_true", help="print a JSON list")
    _server_options(sessions)
    return parser


def _server_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--server", metavar="URL", help="a running server to send to (e.g. https://gpu-box:8000), not the data dir"
    )
    command.add_argument(
        "--token", help="the server's token (default: TENSOR_DEBUGGER_TOKEN); sent as Authorization: Bearer"
    )
