"""docker-compose.yml and the Dockerfile, read as Docker would read them (no Docker engine runs here): every
reference resolves (services, volumes, the build, the database URL), every service has a health check, every
setting named is a documented one, the image builds in two stages and runs as a non-root user without installing
anything at start-up, and the app's health check asks a path the server answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from tensor_debugger.settings import ENV_PREFIX, setting_docs

from tests.support import loopback_http
from tests.support.compose import command_words
from tests.support.servers import LiveServer

REPO = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (REPO / "Dockerfile").read_text()
OURS = "tensor-debugger:local"
ONE_SHOT = {"createbuckets"}  # runs to completion; others wait for service_completed_successfully


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
    assert {"app", "app-2", "postgres", "minio", "createbuckets"} <= SERVICES.keys()
    assert {"dask-scheduler", "dask-worker-1", "dask-worker-2"} <= SERVICES.keys()
    for name, service in SERVICES.items():
        if service["image"] == OURS:  # ours: built from this Dockerfile, never pulled
            assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}, name
        else:
            assert "build" not in service and ":" in service["image"], name


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
    bucket = SERVICES["createbuckets"]
    assert bucket["environment"]["MINIO_ROOT_USER"] == SERVICES["minio"]["environment"]["MINIO_ROOT_USER"]
    assert "http://minio:9000" in " ".join(command_words(bucket["command"]))


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


def test_the_replicas_and_the_dask_workers_keep_the_arrays_in_minio() -> None:
    minio = SERVICES["minio"]["environment"]
    bucket = SERVICES["createbuckets"]["environment"]["BUCKET"]
    published = {port.rsplit(":", 1)[1] for port in SERVICES["minio"]["ports"]}
    for name in ("app", "app-2", "dask-worker-1", "dask-worker-2"):
        environment = SERVICES[name]["environment"]
        store = urlsplit(environment["TENSOR_DEBUGGER_STORE_URL"])
        assert (store.scheme, store.hostname) == ("s3", bucket) and store.path.strip("/"), name
        endpoint = urlsplit(environment["AWS_ENDPOINT_URL"])
        assert endpoint.hostname == "minio" and str(endpoint.port) in published, name
        assert endpoint.scheme == "http" and environment["AWS_ALLOW_HTTP"] == "true", name  # MinIO here is plain
        assert (environment["AWS_ACCESS_KEY_ID"], environment["AWS_SECRET_ACCESS_KEY"]) == (
            minio["MINIO_ROOT_USER"],
            minio["MINIO_ROOT_PASSWORD"],
        ), name
        assert environment["AWS_REGION"], name
        assert SERVICES[name]["depends_on"]["createbuckets"] == {"condition": "service_completed_successfully"}


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
    environment = SERVICES["app"]["environment"]
    assert environment["TENSOR_DEBUGGER_HOST"] == "0.0.0.0"
    assert str(environment["TENSOR_DEBUGGER_TOKEN"]).startswith("${TENSOR_DEBUGGER_TOKEN:?")


def test_the_health_checks_ask_what_the_server_answers(shared_server: LiveServer) -> None:
    """What they ask must answer 200 with a token set too: a static file, which needs none."""
    checks = [" ".join(SERVICES[name]["healthcheck"]["test"]) for name in ("app", "app-2")]
    checks.append(re.search(r"HEALTHCHECK .*", re.sub(r"\\\n\s*", "", DOCKERFILE)).group(0))  # type: ignore[union-attr]
    for check in checks:
        url = re.search(r"http://127\.0\.0\.1:8000(/[^'\"]*)", check)
        assert url is not None, check
        assert loopback_http.get(shared_server.url + url.group(1), timeout=30).status_code == 200
