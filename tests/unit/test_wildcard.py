import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scow.core.wildcard import HierarchicalRepository, WildcardMatcher, matches, specificity


def reference_regex(pattern: str) -> re.Pattern[str]:
    """An independent translation: match against "." + address, one `\\.word` per word."""
    parts = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(r"\." + re.escape(word))
    return re.compile("".join(parts))


def reference_matches(pattern: str, address: str) -> bool:
    return reference_regex(pattern).fullmatch("." + address) is not None


words = st.sampled_from(["a", "b", "c", "orders", "", "x1"])
addresses = st.lists(words, min_size=1, max_size=6).map(".".join)
patterns = st.lists(st.one_of(words, st.just("#"), st.just("*")), min_size=1, max_size=6).map(
    ".".join
)


@pytest.mark.parametrize(
    ("pattern", "address", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b", True),
        ("a.#", "a.b.c", True),
        ("a.#", "ab", False),
        ("#", "", True),
        ("#", "a.b.c", True),
        ("#.c", "c", True),
        ("#.c", "a.b.c", True),
        ("#.c", "a.b.cc", False),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.b.b.c", True),
        ("a.*.c", "a.c", False),
        ("*.*", "a.b", True),
        ("*", "a.b", False),
        ("a#", "ab", False),
        ("a#", "a#", True),
        ("#.#", "a", True),
        ("a.#.b.#.c", "a.x.b.y.z.c", True),
        ("a.#.b.#.c", "a.x.y.z.c", False),
    ],
)
def test_matches_examples(pattern: str, address: str, expected: bool) -> None:
    assert matches(pattern, address) is expected


@given(addresses)
def test_any_words_matches_every_address(address: str) -> None:
    assert matches("#", address)


@given(addresses, addresses)
def test_literal_pattern_matches_only_itself(pattern: str, address: str) -> None:
    assert matches(pattern, address) is (pattern == address)


@given(addresses)
def test_single_word_suffix_needs_exactly_one_more_word(address: str) -> None:
    assert not matches(address + ".*", address)
    assert matches(address + ".*", address + ".x")
    assert not matches(address + ".*", address + ".x.y")


@given(addresses, st.lists(words, max_size=3))
def test_any_words_suffix_matches_address_and_all_descendants(address: str, extra) -> None:
    assert matches(address + ".#", ".".join([address, *extra]))


@given(patterns, addresses)
def test_matches_agrees_with_regex_translation(pattern: str, address: str) -> None:
    assert matches(pattern, address) is reference_matches(pattern, address)


def test_exact_beats_wildcards() -> None:
    m = WildcardMatcher()
    assert m.sort_most_specific_first(["#", "a.*", "a.b", "a.#"]) == ["a.b", "a.*", "a.#", "#"]


def test_specificity_compares_word_by_word() -> None:
    assert specificity("a.b.#") > specificity("a.*.c")
    assert specificity("a.*.c") > specificity("a.#.c")
    assert specificity("*.b") > specificity("#.b")
    # on a tie of word kinds, the longer pattern wins
    assert specificity("a.*.#") > specificity("a.*")
    assert specificity("a.#.#") > specificity("a.#")


def test_ties_are_broken_by_pattern_text() -> None:
    m = WildcardMatcher()
    assert m.sort_most_specific_first(["#.b.#", "#.a.#"]) == ["#.a.#", "#.b.#"]


@given(st.lists(patterns, unique=True, max_size=8), addresses)
def test_repository_returns_every_match_most_specific_first(pats, address) -> None:
    repo: HierarchicalRepository[str] = HierarchicalRepository()
    for p in pats:
        repo.add(p, p)
    found = repo.match(address)
    assert set(found) == {p for p in pats if reference_matches(p, address)}
    keys = [specificity(p) for p in found]
    assert keys == sorted(keys, reverse=True)


def test_repository_cache_is_invalidated_on_add_and_remove() -> None:
    repo: HierarchicalRepository[int] = HierarchicalRepository()
    repo.add("#", 1)
    assert repo.match("orders.eu") == [1]
    repo.add("orders.#", 2)
    assert repo.match("orders.eu") == [2, 1]
    repo.add("orders.#", 3)  # replaces
    assert repo.match("orders.eu") == [3, 1]
    assert repo.remove("#")
    assert repo.match("orders.eu") == [3]
    assert not repo.remove("#")
    assert repo.match("other") == []


def test_repository_cache_is_bounded() -> None:
    repo: HierarchicalRepository[int] = HierarchicalRepository(cache_size=4)
    repo.add("#", 1)
    for i in range(20):
        assert repo.match(f"q{i}") == [1]
    assert len(repo._cache) <= 4


def test_custom_syntax() -> None:
    m = WildcardMatcher(delimiter="/", any_words=">", single_word="+")
    assert m.matches("a/>", "a/b/c")
    assert m.matches("a/+", "a/b")
    assert not m.matches("a.#", "a.b")
    with pytest.raises(ValueError, match="three different"):
        WildcardMatcher(delimiter=".", any_words=".", single_word="*")
