"""compose.yaml checked without Docker: it parses, each profile has what its GPUs need, every rstar command a
service runs exists in the CLI with the flags it passes, and every RSTAR_* variable it sets is a real setting."""

from __future__ import annotations

import copy
import re

import pytest
import typer
import yaml

from rstar.cli import app
from rstar.config import Settings
from tests.conftest import REPO_ROOT

# ${NAME}, ${NAME:-default} and ${NAME:?error}, which compose refuses to start without.
INTERPOLATION = re.compile(r"\$\{([A-Z_]+)(?::?([-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())


def interpolated(value: str) -> str:
    """A value as compose would see it with no variables set but the required ones: each ${NAME:-default}
    replaced by its default, each required ${NAME:?error} by the placeholder `<NAME>`."""
    return INTERPOLATION.sub(lambda match: f"<{match.group(1)}>" if match.group(2) == "?" else (match.group(3) or ""), value)


def required_variables(value: str) -> set[str]:
    return {match.group(1) for match in INTERPOLATION.finditer(value) if match.group(2) == "?"}


def command_problems(argv: list[str]) -> list[str]:
    """Why `rstar ARGV` would not parse: an unknown subcommand or a flag that subcommand does not have."""
    command = typer.main.get_command(app)
    words = [interpolated(str(word)) for word in argv]
    path = []
    while hasattr(command, "commands"):  # a group of subcommands (typer's own click)
        if not words or words[0] not in command.commands:
            if command.params and (not words or words[0].startswith("-")):
                break  # a group that runs itself with its options (`rstar ui --endpoint URL`)
            return [f"`rstar {' '.join(path + words[:1])}` is not a command"]
        path.append(words[0])
        command = command.commands[words.pop(0)]
    flags = {option for param in command.params for option in (*param.opts, *param.secondary_opts)}
    return [f"`rstar {' '.join(path)}` has no flag {word}" for word in words if word.startswith("-") and word.split("=")[0] not in flags]


def setting_problems(variable: str) -> list[str]:
    """Why an RSTAR_ variable would not set anything: no settings field at its path."""
    model: type = Settings
    for part in variable.removeprefix("RSTAR_").lower().split("__"):
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return [f"{variable} names no setting"]
        model = fields[part].annotation
    return []


def compose_problems(compose: dict) -> list[str]:
    problems = []
    for name, service in compose["services"].items():
        if "entrypoint" not in service and "command" in service:  # the image's entrypoint is `rstar`
            problems += [f"{name}: {p}" for p in command_problems(service["command"])]
        for variable in service.get("environment", {}):
            if variable.startswith("RSTAR_"):
                problems += [f"{name}: {p}" for p in setting_problems(variable)]
    return problems


def test_every_command_and_flag_and_setting_exists(compose):
    assert compose_problems(compose) == []
    checked = {name for name, service in compose["services"].items() if "command" in service and "entrypoint" not in service}
    assert checked == {"sandbox", "ui", "api-cuda", "api-rocm"}


def test_the_check_catches_an_unknown_flag_a_command_and_a_setting(compose):
    broken = copy.deepcopy(compose)
    broken["services"]["api-cuda"]["command"] = ["serve", "--replicas", "2", "--gpus", "8"]
    broken["services"]["ui"]["command"] = ["webui"]
    broken["services"]["sandbox"]["environment"] = {"RSTAR_ENGINE__REPLICA": "2", "RSTAR_SANDBOX__RAY_ADDRESS": "auto"}
    assert compose_problems(broken) == [
        "sandbox: RSTAR_ENGINE__REPLICA names no setting",
        "ui: `rstar webui` is not a command",
        "api-cuda: `rstar serve` has no flag --gpus",
    ]


def profile(compose: dict, name: str) -> dict:
    return {key: service for key, service in compose["services"].items() if name in service.get("profiles", ())}


def test_each_gpu_profile_has_a_ray_head_workers_and_an_api_serving_replicas_on_them(compose):
    for name in ("cuda", "rocm"):
        services = profile(compose, name)
        assert set(services) == {f"ray-head-{name}", f"ray-worker-{name}", f"api-{name}"}
        assert services[f"ray-head-{name}"]["entrypoint"][:3] == ["ray", "start", "--head"]
        assert "--address=ray-head:6379" in services[f"ray-worker-{name}"]["entrypoint"]
        command = [interpolated(str(word)) for word in services[f"api-{name}"]["command"]]
        assert command[command.index("--ray-address") + 1] == "ray-head:6379"
        assert command[command.index("--replicas") + 1] == "1"
    shared = [key for key, service in compose["services"].items() if "profiles" not in service]
    assert sorted(shared) == ["postgres", "sandbox", "ui"]


def test_cuda_reserves_nvidia_gpus_and_rocm_opens_the_amd_devices_on_a_rocm_image(compose):
    for key in ("ray-head-cuda", "ray-worker-cuda"):
        devices = compose["services"][key]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
    for key in ("ray-head-rocm", "ray-worker-rocm", "api-rocm"):
        service = compose["services"][key]
        assert interpolated(service["build"]["args"]["BASE_IMAGE"]) == "rocm/vllm:latest"
        assert service["image"] == "rstar:rocm"
    for key in ("ray-head-rocm", "ray-worker-rocm"):
        service = compose["services"][key]
        assert service["devices"] == ["/dev/kfd", "/dev/dri"] and service["group_add"] == ["video"]


def test_the_keys_are_required_and_nothing_that_runs_code_is_open(compose):
    services = compose["services"]
    # The api services are `<<: [*api, *rstar]`; compose takes `environment` from the first (x-api), where
    # PyYAML's merge would take the last, so x-api is read itself.
    api = compose["x-api"]
    for name, service in (("api", api), ("ui", services["ui"])):
        assert required_variables(service["environment"]["RSTAR_API_KEY"]) == {"RSTAR_API_KEY"}, name
    for name, service in (("api", api), ("sandbox", services["sandbox"])):
        assert required_variables(service["environment"]["RSTAR_SANDBOX__TOKEN"]) == {"RSTAR_SANDBOX_TOKEN"}, name
    assert api["environment"]["RSTAR_ADMIN_KEY"] is None  # passed through only when the operator sets it
    for name in ("ray-head-cuda", "ray-head-rocm"):
        assert "--dashboard-host=127.0.0.1" in services[name]["entrypoint"], name
    sandbox = services["sandbox"]
    assert sandbox["volumes"] == ["containers:/containers"] and "ports" not in sandbox  # the containers' files only
    assert set(sandbox["environment"]) == {"RSTAR_SANDBOX__TOKEN", "RSTAR_SANDBOX__CONTAINERS_DIR"}  # no database URL, no data dir


def test_the_api_and_the_sandbox_share_the_containers_directory(compose):
    """A container's files are written by the API (uploads) and by its cells in the sandbox: one volume, at the
    one path both are told. The api services take volumes from x-api, the first of their merge (as compose does)."""
    sandbox, api = compose["services"]["sandbox"], compose["x-api"]
    mounts = {service: dict(volume.split(":")[::-1] for volume in config["volumes"]) for service, config in (("sandbox", sandbox), ("api", api))}
    for service, config in (("sandbox", sandbox), ("api", api)):
        directory = config["environment"]["RSTAR_SANDBOX__CONTAINERS_DIR"]
        assert mounts[service][directory] == "containers", service
    assert "containers" in compose["volumes"]
    assert {"/data": "rstar-data", "/hf-cache": "hf-cache"}.items() <= mounts["api"].items()  # x-rstar's, kept
