import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scow.core.address_settings import (
    ADDRESS_SETTING_DOCS,
    AddressSettings,
    AddressSettingsRepository,
    SettingError,
    parse_duration_ms,
    parse_size,
)


def test_defaults_are_artemis_defaults() -> None:
    s = AddressSettings()
    assert s.max_size_bytes == -1
    assert s.max_size_messages == -1
    assert s.page_size_bytes == 10485760
    assert s.page_max_cache_size == 5
    assert s.address_full_policy == "PAGE"
    assert s.max_read_page_messages == -1
    assert s.max_read_page_bytes == 20971520
    assert s.max_delivery_attempts == 10
    assert s.dead_letter_address is None
    assert s.expiry_address is None
    assert s.expiry_delay == -1
    assert s.redelivery_delay == 0
    assert s.auto_create_addresses and s.auto_create_queues
    assert s.auto_delete_addresses and s.auto_delete_queues
    assert not s.auto_delete_created_queues
    assert s.default_address_routing_type == "MULTICAST"
    assert s.default_queue_routing_type == "MULTICAST"
    assert s.default_max_consumers == -1
    assert not s.send_to_dla_on_no_route


def test_every_setting_is_a_documented_field() -> None:
    fields = {f.name.replace("_", "-") for f in dataclasses.fields(AddressSettings)}
    assert fields == set(ADDRESS_SETTING_DOCS)
    assert all(doc.strip() for doc in ADDRESS_SETTING_DOCS.values())
    assert AddressSettings().to_dict().keys() == ADDRESS_SETTING_DOCS.keys()


def test_merge_is_key_by_key_most_specific_first() -> None:
    s = AddressSettings.merge(
        [
            {"max-size-bytes": "1MiB"},  # most specific
            {"max-size-bytes": 5, "address-full-policy": "BLOCK"},
            {"address-full-policy": "DROP", "max-delivery-attempts": 3},
        ]
    )
    assert s.max_size_bytes == 1024 * 1024
    assert s.address_full_policy == "BLOCK"
    assert s.max_delivery_attempts == 3
    assert s.page_size_bytes == 10485760


def test_max_read_page_bytes_follows_page_size_unless_set() -> None:
    assert AddressSettings.merge([{"page-size-bytes": "1MiB"}]).max_read_page_bytes == 2 * 2**20
    s = AddressSettings.merge([{"max-read-page-bytes": 100}, {"page-size-bytes": "1MiB"}])
    assert s.max_read_page_bytes == 100


def test_repository_merges_matching_patterns() -> None:
    repo = AddressSettingsRepository()
    repo.add("#", {"dead-letter-address": "DLA", "max-size-bytes": "10MiB"})
    repo.add("orders.#", {"max-size-bytes": "1MiB", "address-full-policy": "BLOCK"})
    repo.add("orders.eu", {"address-full-policy": "FAIL"})
    eu = repo.get("orders.eu")
    assert (eu.address_full_policy, eu.max_size_bytes, eu.dead_letter_address) == (
        "FAIL",
        2**20,
        "DLA",
    )
    us = repo.get("orders.us")
    assert (us.address_full_policy, us.max_size_bytes) == ("BLOCK", 2**20)
    other = repo.get("invoices")
    assert (other.address_full_policy, other.max_size_bytes) == ("PAGE", 10 * 2**20)


def test_repository_cache_is_cleared_on_add() -> None:
    repo = AddressSettingsRepository()
    assert repo.get("q").max_delivery_attempts == 10
    assert repo.get("q") is repo.get("q")
    repo.add("q", {"max-delivery-attempts": 2})
    assert repo.get("q").max_delivery_attempts == 2
    assert repo.remove("q")
    assert repo.get("q").max_delivery_attempts == 10


def test_unknown_setting_suggests_the_close_one() -> None:
    repo = AddressSettingsRepository()
    with pytest.raises(SettingError) as info:
        repo.add("#", {"max-size-byte": 5})
    assert str(info.value) == (
        "address-settings '#': unknown setting 'max-size-byte'; did you mean 'max-size-bytes'?"
    )


def test_bad_choice_names_setting_value_and_choices() -> None:
    with pytest.raises(SettingError) as info:
        AddressSettingsRepository().add("orders.#", {"default-queue-routing-type": "ANYCST"})
    msg = str(info.value)
    assert "address-settings 'orders.#'" in msg
    assert "default-queue-routing-type = 'ANYCST'" in msg
    assert "ANYCAST, MULTICAST" in msg
    assert "did you mean 'ANYCAST'?" in msg


def test_a_full_policy_is_any_name_a_plugin_may_provide() -> None:
    """Which policies exist is known only once plugins load: startup checks the name."""
    s = AddressSettings.merge([{"address-full-policy": "drop_non_durable"}])
    assert s.address_full_policy == "DROP_NON_DURABLE"
    with pytest.raises(SettingError, match="expected a policy name such as PAGE"):
        AddressSettings.merge([{"address-full-policy": 5}])


def test_choices_are_case_insensitive() -> None:
    s = AddressSettings.merge(
        [{"address-full-policy": "block", "default-queue-routing-type": "anycast"}]
    )
    assert (s.address_full_policy, s.default_queue_routing_type) == ("BLOCK", "ANYCAST")


@pytest.mark.parametrize(
    ("setting", "value", "fragment"),
    [
        ("max-delivery-attempts", "ten", "expected an integer"),
        ("max-delivery-attempts", True, "expected an integer"),
        ("auto-create-queues", "yes", "expected a boolean"),
        ("auto-create-queues", 1, "expected a boolean"),
        ("dead-letter-address", 5, "expected a non-empty string"),
        ("max-size-bytes", "10 parsecs", "expected an integer byte count"),
        ("max-size-bytes", -5, "-1 (disabled) or a non-negative value"),
        ("page-size-bytes", 0, "expected a value >= 1"),
        ("redelivery-delay", -1, "a value >= 0"),
        ("expiry-delay", "soon", "integer milliseconds"),
    ],
)
def test_bad_values_are_rejected_with_what_is_accepted(setting, value, fragment) -> None:
    with pytest.raises(SettingError) as info:
        AddressSettingsRepository().add("#", {setting: value})
    assert f"{setting} = {value!r}" in str(info.value)
    assert fragment in str(info.value)
    assert info.value.setting == setting


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (1234, 1234),
        (-1, -1),
        ("-1", -1),
        ("0", 0),
        ("512", 512),
        ("512B", 512),
        ("490KiB", 490 * 1024),
        ("512K", 512 * 1024),
        ("512k", 512 * 1024),
        ("10MiB", 10 * 2**20),
        ("10M", 10 * 2**20),
        ("10 MiB", 10 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1GB", 10**9),
        ("5MB", 5 * 10**6),
        ("1.5MiB", 1572864),
        ("1TiB", 2**40),
    ],
)
def test_parse_size(text, expected) -> None:
    assert parse_size(text, "max-size-bytes") == expected


@pytest.mark.parametrize("bad", ["", "MiB", "10XB", "-5MiB", "1.2.3K", True, 1.5, None])
def test_parse_size_rejects(bad) -> None:
    with pytest.raises(SettingError, match="max-size-bytes"):
        parse_size(bad, "max-size-bytes")


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["K", "KiB", "M", "MiB", "GiB"]))
def test_binary_units_are_powers_of_1024(n, unit) -> None:
    power = {"K": 1, "KiB": 1, "M": 2, "MiB": 2, "GiB": 3}[unit]
    assert parse_size(f"{n}{unit}", "x") == n * 1024**power


@pytest.mark.parametrize(
    ("text", "expected"),
    [(250, 250), ("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000),
     ("1d", 86_400_000), ("1.5s", 1500), (-1, -1)],
)  # fmt: skip
def test_parse_duration_ms(text, expected) -> None:
    assert parse_duration_ms(text, "expiry-delay") == expected
