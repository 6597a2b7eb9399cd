"""The `scow` command line on good and bad config files, run as a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = '[plugins]\nenable = ["amqp", "memory-journal", "standard-queues", "full-policies"]\n'


def scow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`scow ARGS` as the console script runs it; fails the test if it hangs."""
    return subprocess.run(
        [sys.executable, "-m", "scow.core.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scow.toml"
    path.write_text(text)
    return path


def run_rejected(tmp_path: Path, text: str, *, names_file: bool = True) -> str:
    """`scow run` on a bad config: it must exit non-zero without starting; returns stderr."""
    # a loopback ephemeral listener, so a config wrongly accepted cannot clash with anything
    path = config(tmp_path, text)
    try:
        result = scow("run", "--config", str(path), "--listen", "127.0.0.1:0", cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("scow run started with a bad config instead of refusing it")
    assert result.returncode != 0, result.stdout
    if names_file:
        assert str(path) in result.stderr  # the message says which file
    return result.stderr


def test_unknown_section_is_named_with_a_suggestion(tmp_path):
    stderr = run_rejected(tmp_path, PLUGINS + '[brokr]\nname = "x"\n')
    assert "unknown section [brokr]" in stderr
    assert "did you mean [broker]?" in stderr


def test_unknown_key_is_named_with_the_close_name(tmp_path):
    stderr = run_rejected(tmp_path, PLUGINS + '[broker]\nnmae = "x"\n')
    assert "[broker] unknown key 'nmae'" in stderr
    assert "did you mean 'name'?" in stderr


def test_unknown_key_in_a_plugin_section_is_named(tmp_path):
    stderr = run_rejected(tmp_path, PLUGINS + "[amqp]\nmax-frame = 4096\n")
    assert "[amqp] unknown key 'max-frame'" in stderr
    assert "did you mean 'max-frame-size'?" in stderr


def test_unknown_plugin_is_named_with_the_installed_ones(tmp_path):
    text = '[plugins]\nenable = ["amqp", "memory-journal", "standard-queus"]\n'
    stderr = run_rejected(tmp_path, text, names_file=False)
    assert "unknown plugin 'standard-queus'" in stderr
    assert "did you mean 'standard-queues'?" in stderr
    assert "installed:" in stderr and "amqp" in stderr


def test_unknown_plugin_error_names_the_config_file(tmp_path):
    run_rejected(tmp_path, '[plugins]\nenable = ["amqp", "nope"]\n')


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('[broker]\npersistence-enabled = "yes"\n', "[broker] persistence-enabled = 'yes'"),
        ('[amqp]\nproducer-credit = "lots"\n', "[amqp] producer-credit = 'lots'"),
        ("[amqp]\nmax-frame-size = 100\n", "[amqp] max-frame-size = 100"),
        ('[amqp]\nlisten = ["nowhere"]\n', "[amqp] listen = ['nowhere']"),
    ],
    ids=["bool", "int", "minimum", "host-port"],
)
def test_wrongly_typed_value_is_named_with_what_is_accepted(tmp_path, table, fragment):
    stderr = run_rejected(tmp_path, PLUGINS + table)
    assert fragment in stderr
    assert "expected" in stderr


def test_wrongly_typed_address_setting_is_named(tmp_path):
    text = PLUGINS + '[address-settings."orders.#"]\nmax-delivery-attempts = "many"\n'
    stderr = run_rejected(tmp_path, text)
    assert "max-delivery-attempts" in stderr
    assert "'many'" in stderr


def test_invalid_toml_names_the_line(tmp_path):
    stderr = run_rejected(tmp_path, PLUGINS + "[broker\nname = 1\n")
    assert "invalid TOML" in stderr
    assert f"{tmp_path / 'scow.toml'}:3" in stderr


def test_config_check_prints_the_effective_settings(tmp_path):
    path = config(
        tmp_path,
        PLUGINS
        + '[broker]\nname = "checked"\n'
        + '[amqp]\nlisten = ["127.0.0.1:5999"]\nmax-frame-size = "64KiB"\n'
        + '[address-settings."orders.#"]\nmax-delivery-attempts = 3\n',
    )
    result = scow("config", "check", "--config", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"# {path}: valid" in out
    # the file's own values, normalized
    assert 'name = "checked"' in out
    assert 'listen = ["127.0.0.1:5999"]' in out
    assert "max-frame-size = 65536" in out
    assert "max-delivery-attempts = 3" in out
    # and the defaults it did not set
    assert "idle-timeout = 60000" in out
    assert "producer-credit = 1000" in out
    assert "allow-anonymous = true" in out
    assert "# global-max-size = -1 derives " in out  # the value it stands for, in bytes
    for section in ("[broker]", "[amqp]", "[security]", "[plugins]"):
        assert section in out


def test_config_check_rejects_a_bad_file(tmp_path):
    path = config(tmp_path, PLUGINS + '[broker]\nnmae = "x"\n')
    result = scow("config", "check", "--config", str(path), cwd=tmp_path)
    assert result.returncode != 0
    assert "did you mean 'name'?" in result.stderr


def test_plugins_lists_amqp_with_its_hooks(tmp_path):
    path = config(tmp_path, PLUGINS)
    result = scow("plugins", "--config", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    amqp = next(i for i, line in enumerate(lines) if line.split()[:1] == ["amqp"])
    assert lines[amqp].split()[1] == "enabled"
    hooks = []
    for line in lines[amqp + 1 :]:
        if not line.startswith("    "):
            break
        hooks.append(line.strip())
    assert "scow_config_sections" in hooks
    assert "scow_register_protocols" in hooks


def test_plugins_marks_a_listed_but_missing_plugin(tmp_path):
    path = config(tmp_path, '[plugins]\nenable = ["amqp", "no-such-plugin"]\n')
    result = scow("plugins", "--config", str(path), cwd=tmp_path)
    assert result.returncode != 0
    assert any(
        line.split()[:2] == ["no-such-plugin", "MISSING"] for line in result.stdout.splitlines()
    )


def test_size_limit_with_a_policy_no_plugin_provides_stops_startup(tmp_path):
    stderr = run_rejected(
        tmp_path,
        PLUGINS + '[address-settings."orders.#"]\nmax-size-bytes = "10MiB"\n',
        names_file=False,
    )
    assert '[address-settings."orders.#"] address-full-policy = "PAGE"' in stderr
    assert "available: BLOCK, DROP, FAIL" in stderr


def test_a_full_policy_nobody_provides_stops_startup_with_the_close_name(tmp_path):
    stderr = run_rejected(
        tmp_path,
        PLUGINS + '[address-settings."orders.#"]\naddress-full-policy = "BLOKC"\n',
        names_file=False,
    )
    assert '[address-settings."orders.#"] address-full-policy = "BLOKC"' in stderr
    assert "did you mean 'BLOCK'?" in stderr
