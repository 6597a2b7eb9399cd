import re
from pathlib import Path

import pytest

from scow.core.address_settings import ADDRESS_SETTING_DOCS
from scow.core.config import (
    DEFAULT_PLUGINS,
    ConfigError,
    ConfigSection,
    Setting,
    core_sections,
    default_config_path,
    load_config,
    parse_host_port,
    read_plugin_list,
)
from scow.core.model import host_port
from scow.protocols.amqp.plugin import SECTION as AMQP_SECTION

# A stand-in for the amqp plugin's section (the plugin owns the real one).
AMQP = ConfigSection(
    "amqp",
    (
        Setting("listen", list, ["localhost:5672"], "Addresses to listen on.",
                kind="host-port-list"),
        Setting("idle-timeout", int, 60000, "Idle timeout in ms.", kind="duration-ms",
                minimum=0),
        Setting("max-frame-size", int, 131072, "Largest frame.", kind="size", minimum=512),
        Setting("sasl-mechanisms", list, ["ANONYMOUS", "PLAIN"], "SASL mechanisms offered.",
                choices=("ANONYMOUS", "PLAIN"), item_type=str),
        Setting("producer-credit", int, 1000, "Link credit given to producers.", minimum=0),
    ),
    "AMQP 1.0 listener.",
)  # fmt: skip


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scow.toml"
    path.write_text(text)
    return path


def test_valid_file_is_loaded(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[plugins]
enable = ["amqp", "file-journal"]

[broker]
name = "b1"
data-dir = "/var/lib/scow"
log-format = "json"

[security]
allow-anonymous = false
users-file = "/etc/scow/users.toml"

[amqp]
listen = ["0.0.0.0:5672", "[::1]:5673"]
idle-timeout = "30s"
max-frame-size = "64KiB"

[address-settings."#"]
dead-letter-address = "DLA"

[address-settings."orders.#"]
max-size-bytes = "10MiB"
address-full-policy = "BLOCK"
""",
    )
    config = load_config(path, [AMQP])
    assert config.path == path
    assert config.enabled_plugins == ("amqp", "file-journal")
    assert config.section("broker")["name"] == "b1"
    assert config.section("broker")["log-format"] == "json"
    assert config.section("security")["users-file"] == "/etc/scow/users.toml"
    amqp = config.section("amqp")
    assert amqp["listen"] == ["0.0.0.0:5672", "[::1]:5673"]
    assert amqp["idle-timeout"] == 30_000
    assert amqp["max-frame-size"] == 65536
    orders = config.address_settings.get("orders.eu")
    assert (orders.max_size_bytes, orders.address_full_policy) == (10 * 2**20, "BLOCK")
    assert orders.dead_letter_address == "DLA"
    assert config.raw["broker"]["name"] == "b1"


def test_amqp_takes_messages_of_up_to_1_gib_and_stores_those_from_100_kib_apart(
    tmp_path: Path,
) -> None:
    """A large message can be what max-message-size allows (1 GiB); from 100 KiB on
    (Artemis's AMQP default) a message is large."""
    amqp = load_config(write(tmp_path, ""), [AMQP_SECTION]).section("amqp")
    assert amqp["max-message-size"] == 1 << 30
    assert amqp["min-large-message-size"] == 100 << 10


def test_defaults_are_filled(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[broker]\nname = 'x'\n"), [AMQP])
    broker = config.section("broker")
    assert dict(broker) == {
        "name": "x",
        "data-dir": "./data",
        "persistence-enabled": True,
        "journal": "",
        "id-cache-size": 20000,
        "persist-id-cache": True,
        "large-messages-directory": "large-messages",
        "large-message-sync": True,
        "message-expiry-scan-period": 30000,
        "global-max-size": -1,
        "global-max-messages": -1,
        "max-disk-usage": 90,
        "min-disk-free": -1,
        "disk-scan-period": 5000,
        "log-format": "console",
        "log-level": "info",
    }
    assert config.section("amqp")["sasl-mechanisms"] == ["ANONYMOUS", "PLAIN"]
    assert config.section("security") == {
        "allow-anonymous": True,
        "users-file": "",
        "anonymous-roles": [],
        "login-failure-delay": 500,
        "max-connections": -1,
        "max-connections-per-user": -1,
        "audit-log": "",
    }
    assert config.enabled_plugins == DEFAULT_PLUGINS
    assert config.address_settings.get("anything").max_delivery_attempts == 10


def test_no_file_means_defaults_only() -> None:
    config = load_config(None, [AMQP])
    assert config.path is None and config.raw == {}
    assert config.section("amqp")["listen"] == ["localhost:5672"]


def test_defaults_are_not_shared_between_configs() -> None:
    a = load_config(None, [AMQP])
    a.section("amqp")["listen"].append("x:1")  # type: ignore[attr-defined]
    assert load_config(None, [AMQP]).section("amqp")["listen"] == ["localhost:5672"]


def test_effective_lists_every_section_with_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, '[address-settings."q"]\nmax-size-bytes = "1KiB"\n')
    eff = load_config(path, [AMQP]).effective()
    assert set(eff) == {
        "broker",
        "plugins",
        "security",
        "security-settings",
        "tls",
        "ha",
        "address-settings",
        "amqp",
        "queues",
    }
    assert eff["amqp"]["producer-credit"] == 1000
    assert eff["address-settings"] == {"q": {"max-size-bytes": 1024}}


def test_unknown_section_suggests_the_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, "[amqpp]\nlisten = []\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, [AMQP])
    msg = str(info.value)
    assert msg.startswith(f"{path}: unknown section [amqpp]; did you mean [amqp]?")
    known = "[address-settings], [amqp], [broker], [ha], [plugins], [queues], [security]"
    assert f"known sections: {known}" in msg
    assert info.value.section == "amqpp"


def test_unknown_section_without_a_close_one_explains_plugin_sections(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown section \[zzz\] \(a plugin's section"):
        load_config(write(tmp_path, "[zzz]\n"), [])


def test_key_outside_any_section_points_to_its_section(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"did you mean \[broker\] data-dir\?"):
        load_config(write(tmp_path, 'data-dir = "/tmp"\n'), [])


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\ndata_dir = "/tmp"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, [])
    assert f"{path}: [broker] unknown key 'data_dir'; did you mean 'data-dir'?" in str(info.value)
    assert (info.value.section, info.value.key) == ("broker", "data_dir")


def test_unknown_key_in_plugin_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[amqp]\nidle-timout = 5\n")
    with pytest.raises(ConfigError, match="did you mean 'idle-timeout'"):
        load_config(path, [AMQP])


def test_open_keys_section_accepts_any_key(tmp_path: Path) -> None:
    open_section = ConfigSection("labels", (), "Free-form labels.", open_keys=True)
    config = load_config(write(tmp_path, '[labels]\nteam = "ops"\n'), [open_section])
    assert config.section("labels") == {"team": "ops"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[broker]\npersistence-enabled = 'yes'\n",
         "[broker] persistence-enabled = 'yes': expected a boolean (true or false)"),
        ("[broker]\nname = 5\n", "[broker] name = 5: expected a string"),
        ("[plugins]\nenable = 'amqp'\n", "[plugins] enable = 'amqp': expected a list"),
        ("[plugins]\nenable = ['amqp', 3]\n", "expected list items to be a string; 3 is not"),
        ("[security]\nusers = { alice = 'x' }\n",
         "[security] unknown key 'users'; did you mean 'users-file'?"),
        ("[amqp]\nproducer-credit = true\n", "expected an integer"),
        ("[amqp]\nproducer-credit = -3\n", "expected a value >= 0"),
        ("[amqp]\nlisten = ['localhost']\n", "'localhost' is not host:port"),
        ("[amqp]\nlisten = ['localhost:99999']\n", "port 99999 is outside 0-65535"),
        ("[amqp]\nidle-timeout = 'soon'\n", "[amqp] idle-timeout = 'soon': expected integer"),
        ("[broker]\n", None),
    ],
)  # fmt: skip
def test_wrong_type_names_section_key_value_and_expectation(tmp_path, text, fragment) -> None:
    path = write(tmp_path, text)
    if fragment is None:
        load_config(path, [AMQP])
        return
    with pytest.raises(ConfigError) as info:
        load_config(path, [AMQP])
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)


def test_bad_choice_lists_choices_and_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[broker]\nlog-level = 'warn'\n"), [])
    msg = str(info.value)
    assert "[broker] log-level = 'warn': expected one of 'debug', 'info', 'warning', 'error'" in msg
    assert "did you mean 'warning'?" in msg


def test_choices_in_lists_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "[amqp]\nsasl-mechanisms = ['PLAIN', 'GSSAPI']\n")
    with pytest.raises(ConfigError, match="expected one of 'ANONYMOUS', 'PLAIN'"):
        load_config(path, [AMQP])


def test_choices_are_case_insensitive(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[broker]\nlog-level = 'DEBUG'\n"), [])
    assert config.section("broker")["log-level"] == "debug"


def test_sizes_accept_units(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[amqp]\nmax-frame-size = "1MiB"\n\n[address-settings."#"]\n'
        'page-size-bytes = "490KiB"\nmax-size-bytes = "1GB"\n',
    )
    config = load_config(path, [AMQP])
    assert config.section("amqp")["max-frame-size"] == 2**20
    s = config.address_settings.get("a")
    assert (s.page_size_bytes, s.max_size_bytes) == (490 * 1024, 10**9)


def test_bad_size_names_the_setting(tmp_path: Path) -> None:
    path = write(tmp_path, '[amqp]\nmax-frame-size = "lots"\n')
    with pytest.raises(ConfigError, match=r"\[amqp\] max-frame-size = 'lots': expected an integer"):
        load_config(path, [AMQP])
    path = write(tmp_path, '[amqp]\nmax-frame-size = "10"\n')
    with pytest.raises(ConfigError, match=">= 512"):
        load_config(path, [AMQP])


def test_bad_address_setting_names_file_pattern_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, '[address-settings."#"]\nmax-size-byte = 5\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, [])
    assert str(info.value) == (
        f"{path}: address-settings '#': unknown setting 'max-size-byte'; "
        "did you mean 'max-size-bytes'?"
    )


def test_address_settings_need_a_table_per_pattern(tmp_path: Path) -> None:
    path = write(tmp_path, "[address-settings]\nmax-size-bytes = 5\n")
    with pytest.raises(ConfigError, match="expected a table per address pattern"):
        load_config(path, [])


def test_toml_syntax_error_has_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nname = "ok"\ndata-dir = \n')
    with pytest.raises(ConfigError) as info:
        load_config(path, [])
    assert (info.value.line, info.value.column) == (3, 12)
    assert str(info.value).startswith(f"{path}:3:12: invalid TOML: ")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml", [])


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[broker]\ndata-dir = "/file"\nname = "n"\n\n[address-settings."q"]\n'
        "max-delivery-attempts = 3\nmax-size-bytes = 7\n",
    )
    config = load_config(
        path,
        [AMQP],
        overrides={
            "broker": {"data-dir": "/flag", "log-level": None},
            "amqp": {"listen": "0.0.0.0:5673"},
            "address-settings": {"q": {"max-delivery-attempts": 5}},
        },
    )
    assert config.section("broker")["data-dir"] == "/flag"
    assert config.section("broker")["name"] == "n"
    assert config.section("broker")["log-level"] == "info"  # None: the flag was not given
    assert config.section("amqp")["listen"] == ["0.0.0.0:5673"]
    q = config.address_settings.get("q")
    assert (q.max_delivery_attempts, q.max_size_bytes) == (5, 7)


def test_bad_override_is_reported_as_an_override(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [], overrides={"broker": {"persistence-enabled": "no"}})
    assert str(info.value).startswith("overrides: [broker] persistence-enabled = 'no'")
    with pytest.raises(ConfigError, match=r"overrides: unknown section \[brokr\]"):
        load_config(None, [], overrides={"brokr": {"data-dir": "x"}})


def test_duplicate_plugin_names_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "[plugins]\nenable = ['amqp', 'amqp']\n")
    with pytest.raises(ConfigError, match="lists 'amqp' twice"):
        read_plugin_list(path)
    with pytest.raises(ConfigError, match="lists 'amqp' twice"):
        load_config(path, [])


def test_read_plugin_list_reads_only_the_plugin_list(tmp_path: Path) -> None:
    # Sections of plugins not loaded yet are not checked here.
    path = write(tmp_path, "[plugins]\nenable = ['amqp']\n\n[whatever]\nx = 1\n")
    assert read_plugin_list(path) == ("amqp",)
    assert read_plugin_list(write(tmp_path, "[broker]\n")) == DEFAULT_PLUGINS
    assert read_plugin_list(None) == DEFAULT_PLUGINS


def test_a_section_declared_twice_is_rejected() -> None:
    other = ConfigSection("amqp", (), "another amqp")
    with pytest.raises(ValueError, match=r"\[amqp\] is declared twice"):
        load_config(None, [AMQP, other])
    # passing the kernel's own sections again is harmless
    load_config(None, [*core_sections(), AMQP])


def test_parse_host_port() -> None:
    assert parse_host_port("localhost:5672") == ("localhost", 5672)
    assert parse_host_port("[::1]:5672") == ("::1", 5672)
    assert parse_host_port(":5672") == ("", 5672)
    with pytest.raises(ValueError):
        parse_host_port("::1:5672")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", "fe80::1%eth0", ""])
def test_host_port_is_what_parse_host_port_reads_back(host: str) -> None:
    assert parse_host_port(host_port(host, 5672)) == (host, 5672)


def _plugin_sections() -> list[ConfigSection]:
    from scow.plugins.database_store.settings import SECTION as DATABASE
    from scow.plugins.file_journal.plugin import SECTION as JOURNAL
    from scow.plugins.management import SECTION as MANAGEMENT
    from scow.plugins.paging import PAGING_SECTION
    from scow.plugins.spark.plugin import SECTION as SPARK
    from scow.protocols.amqp.plugin import SECTION as REAL_AMQP

    return [REAL_AMQP, JOURNAL, PAGING_SECTION, MANAGEMENT, SPARK, DATABASE]


def test_packaged_default_config_loads() -> None:
    path = default_config_path()
    assert path.is_file()
    config = load_config(path, _plugin_sections())
    assert config.enabled_plugins == (
        "amqp",
        "file-journal",
        "standard-queues",
        "priority-queues",
        "last-value-queues",
        "qpid-paged-queues",
        "full-policies",
        "paging",
        "management",
        "spark",
    )
    assert config.section("broker")["data-dir"] == "./data"
    assert config.section("amqp")["listen"] == ["localhost:5672"]
    s = config.address_settings.get("orders")
    assert (s.dead_letter_address, s.expiry_address, s.max_delivery_attempts) == (
        "DLA",
        "ExpiryQueue",
        10,
    )
    assert s.auto_create_addresses and s.auto_create_queues


def test_packaged_default_config_shows_every_kernel_and_builtin_plugin_setting() -> None:
    text = default_config_path().read_text()
    sections = [*core_sections(), *_plugin_sections()]
    assert all(s.doc.strip() for section in sections for s in section.settings)
    names = [s.name for section in sections for s in section.settings]
    names += list(ADDRESS_SETTING_DOCS)
    missing = [n for n in names if f"{n} =" not in text]
    assert missing == []


def test_commented_defaults_in_packaged_config_are_the_real_defaults(tmp_path: Path) -> None:
    """Uncommenting every `# key = value` line of the packaged file (and the `# [section]`
    line of a plugin section shown commented out) must change nothing."""
    sections = [*core_sections(), *_plugin_sections()]
    known = {s.name for section in sections for s in section.settings}
    headers = {f"# [{section.name}]" for section in sections}
    known |= set(ADDRESS_SETTING_DOCS)
    # address settings shown as examples of what to write, not as defaults
    examples = {"page-full-policy", "default-last-value-key", "id-cache-size"}
    setting_line = re.compile(r"^# ([a-z-]+) = (.*?)(\s{2,}#.*)?$")
    lines = []
    section = ""
    for line in default_config_path().read_text().splitlines():
        if line.startswith("["):
            section = line
        m = setting_line.match(line)
        example = section.startswith("[address-settings") and m and m.group(1) in examples
        if m and m.group(1) in known and not example:
            line = f"{m.group(1)} = {m.group(2)}"
        elif line in headers:
            line = line[2:]
        lines.append(line)
    path = write(tmp_path, "\n".join(lines))
    full = load_config(path, _plugin_sections())
    baseline = load_config(default_config_path(), _plugin_sections())
    assert len(full.address_settings.explicit("#") or {}) > 20  # the lines were uncommented
    for name in ("broker", "plugins", "security", "amqp", "journal"):
        assert full.section(name) == baseline.section(name)
    assert full.address_settings.get("x") == baseline.address_settings.get("x")


def test_every_kernel_setting_is_documented() -> None:
    for section in core_sections():
        assert section.doc.strip(), section.name
        for s in section.settings:
            assert s.doc.strip(), f"[{section.name}] {s.name}"
