"""docker-compose.yml and the Dockerfile, read as Docker would read them (no Docker engine runs here), its variables
from `.env.example` as Compose reads a `.env`: every reference resolves (services, volumes, the build, the database
URL, the bucket), every service has a health check, no secret is written in the file, every setting named is a
documented one, the image builds in two stages and runs as a non-root user without installing anything at start-up,
and the app's health check asks a path the server answers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from tensor_debugger.settings import ENV_PREFIX, setting_docs

from tests.support import loopback_http
from tests.support.compose import MissingVariable, command_words, env_example, raw_compose, services
from tests.support.servers import LiveServer

REPO = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = raw_compose()
SERVICES: dict[str, dict[str, Any]] = services()
DOCKERFILE = (REPO / "Dockerfile").read_text()
OURS = "tensor-debugger:local"
ONE_SHOT = {"createbucket"}  # runs to completion; others wait for service_completed_successfully
SECRETS = ("TENSOR_DEBUGGER_TOKEN", "POSTGRES_PASSWORD", "S3_ACCESS_KEY", "S3_SECRET_KEY")


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", "", DOCKERFILE)
    found = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def test_the_stack_has_its_services() -> None:
    assert {"app", "app-2", "postgres", "seaweedfs", "createbucket"} <= SERVICES.keys()
    assert {"dask-scheduler", "dask-worker-1", "dask-worker-2"} <= SERVICES.keys()
    for name, service in SERVICES.items():
        if service["image"] == OURS:  # ours: built from this Dockerfile, never pulled
            assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        else:  # pinned to a release, never `latest`
            assert "build" not in service and re.fullmatch(r"[\w./-]+:\d+(\.\d+)+(-[\w.]+)?", service["image"]), name


def test_every_reference_resolves() -> None:
    declared_volumes = set(COMPOSE["volumes"])
    used_volumes = set()
    for name, service in SERVICES.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in SERVICES, f"{name} depends on an unknown service {dependency}"
            wanted = condition["condition"]
            if dependency in ONE_SHOT:
                assert wanted == "service_completed_successfully", name
            else:
                assert wanted == "service_healthy" and "healthcheck" in SERVICES[dependency], (name, dependency)
            assert set(SERVICES[dependency].get("profiles", [])) <= set(service.get("profiles", [])), (
                f"{name} would wait on {dependency}, which its profile does not start"
            )
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert not source.startswith((".", "/")), f"{name} mounts a host path: {volume}"
            assert source in declared_volumes, f"{name} mounts an undeclared volume {source}"
            used_volumes.add(source)
    assert used_volumes == declared_volumes


def test_every_service_has_a_health_check_and_publishes_on_loopback_only() -> None:
    for name, service in SERVICES.items():
        if name in ONE_SHOT:
            assert service["restart"] == "no" and "healthcheck" not in service
            continue
        check = service["healthcheck"]
        assert check["test"][0] == "CMD" and len(check["test"]) > 1, name
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


def test_settings_named_are_documented_settings() -> None:
    documented = {variable for variable, _, _ in setting_docs()}
    readme = (REPO / "README.md").read_text()
    named = set(re.findall(rf"\b{ENV_PREFIX}[A-Z_]+", (REPO / "docker-compose.yml").read_text() + DOCKERFILE))
    assert named and named <= documented, named - documented
    assert all(f"`{variable}`" in readme for variable in named)


def test_the_replicas_share_one_database_and_answer_to_their_service_names() -> None:
    postgres = SERVICES["postgres"]["environment"]
    replicas = [name for name, s in SERVICES.items() if command_words(s.get("command")) == [] and s["image"] == OURS]
    assert replicas == ["app", "app-2"]
    for name in replicas:
        environment = SERVICES[name]["environment"]
        url = urlsplit(environment["TENSOR_DEBUGGER_DATABASE_URL"])
        assert url.scheme == "postgresql+psycopg" and url.hostname == "postgres" and url.port == 5432
        assert (url.username, url.password, url.path) == (
            postgres["POSTGRES_USER"],
            postgres["POSTGRES_PASSWORD"],
            "/" + postgres["POSTGRES_DB"],
        )
        assert set(replicas) <= set(environment["TENSOR_DEBUGGER_ALLOWED_HOSTS"].split(","))
        assert "tensor-debugger-data:/data" in SERVICES[name]["volumes"]
        assert environment["TENSOR_DEBUGGER_DATA_DIR"] == "/data"


def test_each_replica_has_its_own_address_file_and_links_to_its_published_port() -> None:
    """Two replicas on one data volume: each its own server.json; the links they print lead where a user reaches
    each, with the ports .env sets (8000 and 8001 by default, others when .env says so)."""
    for env in (env_example(), {**env_example(), "APP_PORT": "9100", "APP_2_PORT": "9101"}):
        replicas = services(env)
        files, published = set(), set()
        for name in ("app", "app-2"):
            environment = replicas[name]["environment"]
            files.add(environment["TENSOR_DEBUGGER_ADDRESS_FILE"])
            (port,) = replicas[name]["ports"]
            host, outside, inside = port.split(":")
            assert host == "127.0.0.1" and inside == environment["TENSOR_DEBUGGER_PORT"], name
            assert environment["TENSOR_DEBUGGER_PUBLIC_URL"] == f"http://127.0.0.1:{outside}", name
            published.add(outside)
        assert len(files) == 2 and "server.json" not in files
        assert published == {env["APP_PORT"], env["APP_2_PORT"]}


def test_no_secret_is_written_in_the_file() -> None:
    """Every password and key comes from .env (Compose refuses to start, saying which, without one), .env.example
    names them all, and .env reaches neither the repository nor the image."""
    text = (REPO / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_0-9]+)", text))
    assert set(SECRETS) <= used and used <= env_example().keys()
    for secret in SECRETS:
        assert re.search(rf"\$\{{{secret}:\?[^}}]+\}}", text), secret
        with pytest.raises(MissingVariable, match=secret):
            services({k: v for k, v in env_example().items() if k != secret})
    for name, service in COMPOSE["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY", key):
                assert str(value).startswith("${"), f"{name} writes {key} in the file"
    assert ".env" in (REPO / ".gitignore").read_text().split()
    assert ".env" in (REPO / ".dockerignore").read_text().split()
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, check=False)
    assert ignored.returncode == 0


def test_postgres_is_checked_over_tcp() -> None:
    """The image's first start runs its setup on a server listening on the socket only: a check over the socket
    passes before that ends (docker-library/postgres#880)."""
    check = SERVICES["postgres"]["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"] and check[check.index("-h") + 1] == "127.0.0.1"


def test_the_dask_services_run_the_image_against_the_scheduler() -> None:
    scheduler = command_words(SERVICES["dask-scheduler"]["command"])
    assert scheduler[:2] == ["dask", "scheduler"] and scheduler[scheduler.index("--port") + 1] == "8786"
    for name in ("dask-worker-1", "dask-worker-2"):
        worker = command_words(SERVICES[name]["command"])
        assert worker[:3] == ["dask", "worker", "tcp://dask-scheduler:8786"], name
    for name in ("app", "app-2"):  # the replicas send their pending pairs there, and start once it answers
        assert SERVICES[name]["environment"]["TENSOR_DEBUGGER_DASK_SCHEDULER"] == "tcp://dask-scheduler:8786", name
        assert SERVICES[name]["depends_on"]["dask-scheduler"] == {"condition": "service_healthy"}, name
    assert not any("profiles" in service for service in SERVICES.values())  # the image holds distributed


def test_the_replicas_and_the_dask_workers_keep_the_arrays_in_the_bucket() -> None:
    seaweedfs = SERVICES["seaweedfs"]
    s3_port = next(w.split("=", 1)[1] for w in command_words(seaweedfs["command"]) if w.startswith("-s3.port="))
    published = {port.rsplit(":", 1)[1] for port in seaweedfs["ports"]}
    assert published == {s3_port}
    bucket = SERVICES["createbucket"]["environment"]["BUCKET"]
    assert "weed shell -master=seaweedfs:9333" in " ".join(command_words(SERVICES["createbucket"]["command"]))
    for name in ("app", "app-2", "dask-worker-1", "dask-worker-2"):
        environment = SERVICES[name]["environment"]
        store = urlsplit(environment["TENSOR_DEBUGGER_STORE_URL"])
        assert (store.scheme, store.hostname) == ("s3", bucket) and store.path.strip("/"), name
        endpoint = urlsplit(environment["AWS_ENDPOINT_URL"])
        assert endpoint.hostname == "seaweedfs" and str(endpoint.port) == s3_port, name
        assert endpoint.scheme == "http" and environment["AWS_ALLOW_HTTP"] == "true", name  # plain HTTP inside
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the identity SeaweedFS is started with
            assert environment[key] == seaweedfs["environment"][key], (name, key)
        assert environment["AWS_REGION"], name
        assert SERVICES[name]["depends_on"]["createbucket"] == {"condition": "service_completed_successfully"}


def test_the_image_builds_in_two_stages_and_runs_as_a_user_installing_nothing() -> None:
    instructions = dockerfile_instructions()
    stages = [i for i, (word, _) in enumerate(instructions) if word == "FROM"]
    assert len(stages) == 2 and instructions[stages[0]][1].endswith(" AS build")
    runtime = instructions[stages[1] :]
    assert any(word == "COPY" and args.startswith("--from=build ") for word, args in runtime)
    users = [args for word, args in runtime if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert not any(word == "RUN" and re.search(r"\bpip\b", args) for word, args in runtime)
    start = [args for word, args in runtime if word in ("CMD", "ENTRYPOINT")]
    assert start == ['["tensor-debugger", "serve"]']
    for word, args in instructions:
        if word == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (REPO / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_the_app_listening_beyond_loopback_has_a_token() -> None:
    """`serve` on 0.0.0.0 refuses to start without a token: the file asks for one rather than starting nothing."""
    for name in ("app", "app-2"):
        environment = COMPOSE["services"][name]["environment"]
        assert environment["TENSOR_DEBUGGER_HOST"] == "0.0.0.0"
        assert str(environment["TENSOR_DEBUGGER_TOKEN"]).startswith("${TENSOR_DEBUGGER_TOKEN:?")


def test_the_health_checks_ask_what_the_server_answers(shared_server: LiveServer) -> None:
    """They ask /healthz (the database and the store both answer), which answers 200 with a token set too."""
    checks = [" ".join(SERVICES[name]["healthcheck"]["test"]) for name in ("app", "app-2")]
    checks.append(re.search(r"HEALTHCHECK .*", re.sub(r"\\\n\s*", "", DOCKERFILE)).group(0))  # type: ignore[union-attr]
    for check in checks:
        url = re.search(r"http://127\.0\.0\.1:8000(/[^'\"]*)", check)
        assert url is not None and url.group(1) == "/healthz", check
        answer = loopback_http.get(shared_server.url + url.group(1), timeout=30)
        assert (answer.status_code, answer.json()) == (200, {"database": "ok", "store": "ok"})


def test_the_build_stages_check_of_the_kernels_runs() -> None:
    """The build stage ends by importing the kernels and the chunk loop (`python -c "..."`): that check runs here,
    on this checkout's package built with a C compiler as the image's is, so a module it names that moved would fail
    the image's build."""
    (check,) = [
        re.search(r'python -c "(.*)"', args, re.S).group(1)  # type: ignore[union-attr]
        for word, args in dockerfile_instructions()
        if word == "RUN" and "python -c" in args
    ]
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("kernels: compiled | chunk loop: "), done.stdout
