"""Address wildcards (Artemis syntax) and a repository of values keyed by pattern.

An address is a list of words joined by `.`. In a pattern, the word `#` matches zero or
more words and the word `*` matches exactly one; any other word (including one that merely
contains `#` or `*`) matches itself. So `orders.#` matches `orders`, `orders.eu` and
`orders.eu.paris`, while `orders.*` matches only `orders.eu`.

Specificity, used to order the patterns that match one address (most specific first):

1. a pattern without wildcards (it can only match the address it spells) beats any
   pattern with one;
2. otherwise the patterns are compared word by word from the left: a literal word beats
   `*`, which beats `#`; the first differing word decides;
3. when one pattern's word kinds are a prefix of the other's, the longer pattern wins;
4. remaining ties (`#.a` against `#.b`, both matching `a.b`) are broken by the pattern
   text in ascending order, so the order is deterministic.

Artemis's own comparator ranks any pattern containing `#` below every pattern without it,
then prefers the longer string; rule 2 differs only for patterns such as `a.b.#` against
`a.*.c`, where we prefer the one whose leading words are literal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = [
    "ANY_WORDS",
    "DELIMITER",
    "SINGLE_WORD",
    "HierarchicalRepository",
    "WildcardMatcher",
    "matches",
    "specificity",
]

T = TypeVar("T")

DELIMITER = "."
ANY_WORDS = "#"
SINGLE_WORD = "*"

# Word ranks for specificity keys: higher is more specific.
_RANK_ANY = 0
_RANK_SINGLE = 1
_RANK_LITERAL = 2


class WildcardMatcher:
    """Matches addresses against patterns; the three syntax characters are configurable."""

    __slots__ = ("any_words", "delimiter", "single_word")

    def __init__(
        self,
        delimiter: str = DELIMITER,
        any_words: str = ANY_WORDS,
        single_word: str = SINGLE_WORD,
    ) -> None:
        if len({delimiter, any_words, single_word}) != 3 or not all(
            (delimiter, any_words, single_word)
        ):
            raise ValueError(
                f"wildcard syntax: delimiter {delimiter!r}, any-words {any_words!r} and "
                f"single-word {single_word!r} must be three different non-empty strings"
            )
        self.delimiter = delimiter
        self.any_words = any_words
        self.single_word = single_word

    def is_wildcard(self, pattern: str) -> bool:
        """True when `pattern` contains a `#` or `*` word."""
        return any(w in (self.any_words, self.single_word) for w in pattern.split(self.delimiter))

    def matches(self, pattern: str, address: str) -> bool:
        """True when `address` is matched by `pattern`."""
        if pattern == address:
            return True
        return self._match_words(pattern.split(self.delimiter), address.split(self.delimiter))

    def specificity(self, pattern: str) -> tuple[int, tuple[int, ...]]:
        """A sort key: a larger key is more specific (see the module docstring)."""
        words = pattern.split(self.delimiter)
        ranks = tuple(
            _RANK_ANY
            if w == self.any_words
            else _RANK_SINGLE
            if w == self.single_word
            else _RANK_LITERAL
            for w in words
        )
        exact = 0 if (_RANK_ANY in ranks or _RANK_SINGLE in ranks) else 1
        return (exact, ranks)

    def sort_most_specific_first(self, patterns: list[str]) -> list[str]:
        """`patterns` ordered most specific first, ties broken by pattern text."""
        # Two stable sorts: text ascending, then specificity descending.
        return sorted(sorted(patterns), key=self.specificity, reverse=True)

    def _match_words(self, pw: list[str], aw: list[str]) -> bool:
        # Greedy glob matching with backtracking to the last `#`: O(len(pw) * len(aw)) at
        # worst, linear for the usual one-`#` patterns.
        any_words, single = self.any_words, self.single_word
        p = a = 0
        star_p = -1
        star_a = 0
        np, na = len(pw), len(aw)
        while a < na:
            if p < np and pw[p] == any_words:
                star_p, star_a = p, a
                p += 1
            elif p < np and (pw[p] == single or pw[p] == aw[a]):
                p += 1
                a += 1
            elif star_p >= 0:
                # Let the last `#` swallow one more word and retry from there.
                star_a += 1
                p, a = star_p + 1, star_a
            else:
                return False
        while p < np and pw[p] == any_words:
            p += 1
        return p == np


_DEFAULT_MATCHER = WildcardMatcher()


def matches(pattern: str, address: str) -> bool:
    """True when `address` is matched by `pattern` (default `.`, `#`, `*` syntax)."""
    return _DEFAULT_MATCHER.matches(pattern, address)


def specificity(pattern: str) -> tuple[int, tuple[int, ...]]:
    """Sort key for `pattern` (default syntax); larger is more specific."""
    return _DEFAULT_MATCHER.specificity(pattern)


class HierarchicalRepository(Generic[T]):
    """Values stored under address patterns, looked up by address.

    `match` returns the values of every pattern matching an address, most specific first.
    Results are cached per address; the cache is cleared on every `add` and `remove`, and
    also when it grows past `cache_size` entries (addresses can be unbounded: temporary
    queues, per-client replies).
    """

    def __init__(self, matcher: WildcardMatcher | None = None, cache_size: int = 10_000) -> None:
        self._matcher = matcher or _DEFAULT_MATCHER
        self._values: dict[str, T] = {}
        self._cache: dict[str, tuple[tuple[str, T], ...]] = {}
        self._cache_size = cache_size

    @property
    def matcher(self) -> WildcardMatcher:
        return self._matcher

    def add(self, pattern: str, value: T) -> None:
        """Store `value` under `pattern`, replacing any value already there."""
        self._values[pattern] = value
        self._cache.clear()

    def remove(self, pattern: str) -> bool:
        """Forget `pattern`; False when it was not there."""
        if pattern not in self._values:
            return False
        del self._values[pattern]
        self._cache.clear()
        return True

    def get(self, pattern: str) -> T | None:
        """The value stored under exactly `pattern` (no matching), or None."""
        return self._values.get(pattern)

    def match(self, address: str) -> list[T]:
        """Values of the patterns matching `address`, most specific first."""
        return [value for _, value in self._lookup(address)]

    def match_items(self, address: str) -> list[tuple[str, T]]:
        """(pattern, value) pairs matching `address`, most specific first."""
        return list(self._lookup(address))

    def patterns(self) -> list[str]:
        """Every stored pattern, in insertion order."""
        return list(self._values)

    def items(self) -> list[tuple[str, T]]:
        return list(self._values.items())

    def __contains__(self, pattern: object) -> bool:
        return pattern in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))

    def _lookup(self, address: str) -> tuple[tuple[str, T], ...]:
        hit = self._cache.get(address)
        if hit is not None:
            return hit
        m = self._matcher
        found = m.sort_most_specific_first([p for p in self._values if m.matches(p, address)])
        result = tuple((p, self._values[p]) for p in found)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[address] = result
        return result
