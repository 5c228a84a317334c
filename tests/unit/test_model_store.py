import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rstar.server.model_store import MANIFEST_NAME, ModelNotFound, _write_manifest, cache_problems, resolve_model


def _fake_entry(root: Path, source: str = "test") -> Path:
    entry = root / "SmolLM2-135M-Instruct"
    entry.mkdir(parents=True)
    (entry / "config.json").write_text('{"model_type": "llama"}')
    (entry / "model.safetensors").write_bytes(b"\0" * 4096)
    _write_manifest(entry, source=source)
    return entry


def test_complete_entry_has_no_problems(tmp_path):
    assert cache_problems(_fake_entry(tmp_path)) == []


def test_entry_without_manifest_is_partial(tmp_path):
    entry = _fake_entry(tmp_path)
    (entry / MANIFEST_NAME).unlink()
    assert "did not finish" in cache_problems(entry)[0]


def test_flipped_byte_is_detected_as_corruption(tmp_path):
    entry = _fake_entry(tmp_path)
    with open(entry / "model.safetensors", "r+b") as handle:
        handle.seek(100)
        handle.write(b"\1")
    assert cache_problems(entry) == ["model.safetensors does not match its recorded sha256"]


def test_missing_file_is_detected(tmp_path):
    entry = _fake_entry(tmp_path)
    (entry / "config.json").unlink()
    assert cache_problems(entry) == ["config.json is missing"]


def test_embedded_model_not_pulled_without_pull_says_how(tmp_path):
    with pytest.raises(ModelNotFound, match="rstar model pull"):
        resolve_model("default", tmp_path, pull=False)


def test_local_directory_resolves_to_itself(tmp_path):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")
    resolved = resolve_model(str(tmp_path / "my-model"), tmp_path / "cache")
    assert (resolved.path, resolved.name, resolved.source) == (str(tmp_path / "my-model"), "my-model", "local")


def test_unknown_model_error_names_every_try(tmp_path):
    with pytest.raises(ModelNotFound) as err:
        resolve_model("nobody/no-such-model", tmp_path)
    message = str(err.value)
    assert "embedded names (default" in message
    assert str(Path("nobody/no-such-model").resolve()) in message
    assert "Hugging Face id nobody/no-such-model" in message


def test_directory_without_config_is_named_in_the_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"), tmp_path / "cache")


def _rstar(*args, env_extra=None, python_prelude="pass"):
    """Run the CLI in a fresh interpreter, optionally with some modules made unimportable."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    code = f"import sys; {python_prelude}; sys.argv = ['rstar', *{list(args)!r}]; from rstar.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_serve_with_unknown_model_fails_in_one_line(tmp_path):
    result = _rstar("serve", "--model", "nobody/no-such-model", "--port", "0", env_extra={"RSTAR_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "model 'nobody/no-such-model' not found; tried:" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_on_a_busy_port_fails_in_one_line(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _rstar("serve", "--port", str(port), env_extra={"RSTAR_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_without_an_engine_extra_says_what_to_install(tmp_path):
    # sys.modules[name] = None makes `import name` raise ImportError, as on an install without cpu/gpu extras.
    result = _rstar("serve", python_prelude="sys.modules['vllm'] = None", env_extra={"RSTAR_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "bash install.sh cpu" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_new_chat_template_makes_a_cached_tuned_model_stale(tmp_path):
    """The tuned default carries a copy of the rStar template; a release that changes the template (e.g. a new
    variable) must rebuild the copy, or the model's own template would lag behind rstar's."""
    from dataclasses import replace

    from rstar.server.model_store import SMOLLM2_135M_TOOL, entry_source

    template = tmp_path / "rstar.jinja"
    template.write_text("{{ 'one' }}")
    model = replace(SMOLLM2_135M_TOOL, chat_template=template)
    entry = _fake_entry(tmp_path / "models", source=entry_source(model))
    assert cache_problems(entry, entry_source(model)) == []
    template.write_text("{{ 'two' }}")
    assert "this rstar ships" in cache_problems(entry, entry_source(model))[0]
