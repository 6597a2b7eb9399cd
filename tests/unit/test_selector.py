"""JMS selectors: parsing, three-valued evaluation, errors, and property tests."""

from __future__ import annotations

import functools
import random
import timeit
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scow.core.selector import MAX_NESTING, Selector, SelectorError, compile_selector

T, F, U = True, False, None  # TRUE, FALSE, UNKNOWN


def evaluate(text: str, **env: object) -> bool | None:
    return compile_selector(text).evaluate(env.get)


def check(cases: list[tuple[str, dict[str, object], bool | None]]) -> None:
    for text, env, expected in cases:
        assert evaluate(text, **env) is expected, (text, env)
        assert compile_selector(text).matches(env.get) is (expected is True), (text, env)


# ------------------------------------------------------------------------- literals


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("42", 42),
        ("42L", 42),
        ("42l", 42),
        ("0x1F", 31),
        ("0X1fL", 31),
        ("017", 15),
        ("0", 0),
        ("1.5", 1.5),
        (".5", 0.5),
        ("5.", 5.0),
        ("1e3", 1000.0),
        ("1E+3", 1000.0),
        ("2.5e-1", 0.25),
        ("'it''s'", "it's"),
        ("''", ""),
        ("TRUE", True),
        ("false", False),
        ("True", True),
    ],
)
def test_literal_values(literal: str, value: object) -> None:
    assert evaluate(f"x = {literal}", x=value) is True
    assert evaluate(f"{literal} = x", x=value) is True


def test_integer_literal_equals_float_value() -> None:
    assert evaluate("x = 2", x=2.0) is True
    assert evaluate("x = 2.0", x=2) is True
    assert evaluate("x = 0x10", x=16.0) is True


def test_string_literal_keeps_spaces_and_case() -> None:
    assert evaluate("x = ' Red '", x=" Red ") is True
    assert evaluate("x = 'red'", x="Red") is False


def test_keywords_are_case_insensitive() -> None:
    assert evaluate("x between 1 and 3 aNd NoT y Is nUlL oR z", x=2, y=1) is True
    assert evaluate("x not in ('a') or x like 'b%' escape '!'", x="bc") is True


# ---------------------------------------------------------------------- identifiers


def test_identifiers_with_dollar_underscore_dots_and_unicode() -> None:
    env = {"$a": 1, "_b": 2, "properties.subject": "s", "café": 3, "JMSPriority": 4}
    assert compile_selector(
        "$a = 1 AND _b = 2 AND properties.subject = 's' AND café = 3 AND JMSPriority = 4"
    ).matches(env.get)


def test_identifiers_are_case_sensitive() -> None:
    assert evaluate("Color = 'red'", color="red") is None


def test_lookup_is_called_with_identifier_names() -> None:
    seen: list[str] = []

    def lookup(name: str) -> object:
        seen.append(name)
        return 5

    assert compile_selector("a.b > 1 AND $c < 9").matches(lookup)
    assert seen == ["a.b", "$c"]


def test_selector_lists_its_identifiers() -> None:
    selector = compile_selector("a = 1 OR (b LIKE 'x' AND a IS NULL) OR c IN ('d')")
    assert selector.identifiers == frozenset({"a", "b", "c"})
    assert selector.text == "a = 1 OR (b LIKE 'x' AND a IS NULL) OR c IN ('d')"
    assert repr(selector) == "Selector(\"a = 1 OR (b LIKE 'x' AND a IS NULL) OR c IN ('d')\")"


def test_keyword_lookalike_non_ascii_word_is_an_identifier() -> None:
    # '\u0131n'.upper() == 'IN', yet it must not become the keyword
    assert evaluate("\u0131n = 1", **{"\u0131n": 1}) is True


def test_boolean_identifier_is_a_condition() -> None:
    check(
        [
            ("flag", {"flag": True}, T),
            ("flag", {"flag": False}, F),
            ("flag", {}, U),
            ("flag", {"flag": "true"}, U),
            ("flag", {"flag": 1}, U),
            ("NOT flag", {"flag": False}, T),
            ("(flag)", {"flag": True}, T),
            ("flag AND x = 1", {"flag": True, "x": 1}, T),
        ]
    )


def test_top_level_result_must_be_true_to_match() -> None:
    selector = compile_selector("x = 1")
    assert selector.matches({"x": 1}.get) is True
    assert selector.matches({"x": 2}.get) is False
    assert selector.matches({}.get) is False
    assert selector.evaluate({}.get) is None


# ---------------------------------------------------------------------- comparisons


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("x = 1", {"x": 1}, T),
        ("x = 1", {"x": 2}, F),
        ("x = 1", {}, U),
        ("x <> 1", {"x": 2}, T),
        ("x <> 1", {"x": 1}, F),
        ("x <> 1", {}, U),
        ("x < 2", {"x": 1}, T),
        ("x < 2", {"x": 2}, F),
        ("x < 2", {}, U),
        ("x <= 2", {"x": 2}, T),
        ("x <= 2", {"x": 3}, F),
        ("x <= 2", {}, U),
        ("x > 2", {"x": 2.5}, T),
        ("x > 2", {"x": 2}, F),
        ("x > 2", {}, U),
        ("x >= 2", {"x": 2.0}, T),
        ("x >= 2", {"x": 1.9}, F),
        ("x >= 2", {}, U),
        ("2 < x", {"x": 3}, T),
        ("2 < x", {"x": 1}, F),
        ("x = y", {"x": "a", "y": "a"}, T),
        ("x = y", {"x": "a", "y": "b"}, F),
        ("x = y", {"x": "a"}, U),
        ("x < y", {"x": 1, "y": 1.5}, T),
        ("x >= y", {"x": 1, "y": 1.5}, F),
        ("x < y", {"y": 1.5}, U),
        ("x = 'red'", {"x": "red"}, T),
        ("x = 'red'", {"x": "blue"}, F),
        ("x <> 'red'", {"x": "blue"}, T),
        ("x <> 'red'", {"x": "red"}, F),
        ("x = TRUE", {"x": True}, T),
        ("x = TRUE", {"x": False}, F),
        ("x <> FALSE", {"x": True}, T),
        ("x = TRUE", {}, U),
        ("(x = 1) = (y = 2)", {"x": 1, "y": 2}, T),
        ("(x = 1) <> (y = 2)", {"x": 1, "y": 2}, F),
        ("(x = 1) = TRUE", {}, U),
    ],
)
def test_comparison(text: str, env: dict[str, object], expected: bool | None) -> None:
    check([(text, env, expected)])


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("x = 1", {"x": "1"}),
        ("x = '1'", {"x": 1}),
        ("x <> '1'", {"x": 1}),
        ("x = 1", {"x": True}),
        ("x = TRUE", {"x": 1}),
        ("x = TRUE", {"x": "TRUE"}),
        ("x = 'a'", {"x": False}),
        ("x > 1", {"x": "2"}),
        ("x > 1", {"x": True}),
        ("x < y", {"x": "a", "y": "b"}),
        ("x < y", {"x": True, "y": False}),
        ("x = y", {"x": 1, "y": "1"}),
        ("x >= 1", {"x": b"\x02"}),
        ("x < 1", {"x": object()}),
        ("1 = 'a'", {}),
    ],
)
def test_type_mismatch_is_unknown(text: str, env: dict[str, object]) -> None:
    check([(text, env, U)])


def test_other_types_compare_by_equality_only() -> None:
    u = uuid.UUID(int=7)
    check(
        [
            ("x = y", {"x": u, "y": uuid.UUID(int=7)}, T),
            ("x = y", {"x": u, "y": uuid.UUID(int=8)}, F),
            ("x <> y", {"x": u, "y": uuid.UUID(int=8)}, T),
            ("x = y", {"x": b"ab", "y": b"ab"}, T),
            ("x = 'ab'", {"x": b"ab"}, F),
            ("x <> 'ab'", {"x": b"ab"}, T),
            ("x = y", {"x": u}, U),
        ]
    )


def test_other_type_whose_equality_misbehaves_is_unknown() -> None:
    class Weird:
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no")

        __hash__ = object.__hash__

    assert evaluate("x = y", x=Weird(), y=Weird()) is None
    assert evaluate("x IN ('a')", x=Weird()) is None


def test_subclasses_of_plain_types_behave_like_them() -> None:
    class ULong(int):
        pass

    class Symbol(str):
        pass

    check(
        [
            ("x = 5 AND x > 4 AND x BETWEEN 1 AND 9 AND x IN (5)", {"x": ULong(5)}, T),
            ("x = 'a' AND x LIKE 'a' AND x IN ('a')", {"x": Symbol("a")}, T),
            ("x + 1 = 6", {"x": ULong(5)}, T),
        ]
    )


def test_nan_is_never_equal() -> None:
    nan = float("nan")
    check([("x = x", {"x": nan}, F), ("x <> x", {"x": nan}, T), ("x < 1", {"x": nan}, F)])


# ----------------------------------------------------------------------- logic (3VL)

_TRUTH = {"T": "x = 1", "F": "x = 2", "U": "missing = 1"}
_AND = {
    ("T", "T"): T, ("T", "F"): F, ("T", "U"): U,
    ("F", "T"): F, ("F", "F"): F, ("F", "U"): F,
    ("U", "T"): U, ("U", "F"): F, ("U", "U"): U,
}  # fmt: skip
_OR = {
    ("T", "T"): T, ("T", "F"): T, ("T", "U"): T,
    ("F", "T"): T, ("F", "F"): F, ("F", "U"): U,
    ("U", "T"): T, ("U", "F"): U, ("U", "U"): U,
}  # fmt: skip


@pytest.mark.parametrize(("a", "b"), list(_AND))
def test_and_or_truth_tables(a: str, b: str) -> None:
    env = {"x": 1}
    assert evaluate(f"{_TRUTH[a]} AND {_TRUTH[b]}", **env) is _AND[a, b]
    assert evaluate(f"{_TRUTH[a]} OR {_TRUTH[b]}", **env) is _OR[a, b]


def test_not_truth_table() -> None:
    check([("NOT x = 1", {"x": 1}, F), ("NOT x = 1", {"x": 2}, T), ("NOT x = 1", {}, U)])


def test_long_and_or_chains() -> None:
    parts = [f"x{i} = {i}" for i in range(300)]
    env = {f"x{i}": i for i in range(300)}
    assert compile_selector(" AND ".join(parts)).evaluate(env.get) is True
    assert compile_selector(" AND ".join([*parts, "y = 1"])).evaluate(env.get) is None
    assert compile_selector(" AND ".join([*parts, "y = 1", "x0 = 9"])).evaluate(env.get) is False
    assert compile_selector(" OR ".join([*parts, "y = 1"])).evaluate(env.get) is True
    assert compile_selector(" OR ".join(["y = 1", "x0 = 9", "x1 = 9"])).evaluate(env.get) is None
    assert compile_selector(" OR ".join(["x0 = 9", "x1 = 9", "x2 = 9"])).evaluate(env.get) is False
    assert compile_selector(" + ".join(["x1"] * 300) + " = 300").evaluate(env.get) is True


# ------------------------------------------------------------------------ precedence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = 1 OR a = 2 AND b = 9", T),  # OR < AND: a = 1 OR (a = 2 AND b = 9)
        ("(a = 1 OR a = 2) AND b = 9", F),
        ("NOT a = 2 AND b = 2", T),  # NOT binds tighter than AND, looser than =
        ("NOT (a = 1 OR b = 2)", F),
        ("NOT a = 1 OR b = 2", T),
        ("1 + 2 * 3 = 7", T),
        ("(1 + 2) * 3 = 9", T),
        ("10 - 4 - 3 = 3", T),  # left associative
        ("24 / 4 / 2 = 3", T),
        ("-a * 2 = -2", T),
        ("- -a = 1", T),
        ("2 * -a + 3 = 1", T),
        ("a + 1 BETWEEN 1 + 1 AND 2 * 1", T),
        ("NOT a BETWEEN 5 AND 9", T),
        ("a = 1 AND NOT NOT b = 2", T),
        ("a * 2 IN (2, 3)", T),
        ("-a IS NOT NULL", T),
    ],
)
def test_precedence(text: str, expected: bool | None) -> None:
    assert evaluate(text, a=1, b=2) is expected


# ------------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("a + b = 3", {"a": 1, "b": 2}, T),
        ("a + b = 4", {"a": 1, "b": 2}, F),
        ("a + b = 3", {"a": 1}, U),
        ("a - b = -1", {"a": 1, "b": 2}, T),
        ("a * b = 2.5", {"a": 1.25, "b": 2}, T),
        ("a / b = 3", {"a": 7, "b": 2}, T),  # integer division truncates, as in Java
        ("a / b = -3", {"a": -7, "b": 2}, T),
        ("a / b = -3", {"a": 7, "b": -2}, T),
        ("a / b = 3.5", {"a": 7.0, "b": 2}, T),
        ("a / b = 3.5", {"a": 7, "b": 2.0}, T),
        ("a / 0 = 1", {"a": 1}, U),
        ("a / 0.0 > 1", {"a": 1.0}, U),
        ("NOT a / b = 1", {"a": 1, "b": 0}, U),
        ("a + 1 = 2", {"a": "1"}, U),
        ("a + 1 = 2", {"a": True}, U),
        ("-a = -1", {"a": "1"}, U),
        ("+a = 1", {"a": "1"}, U),
        ("+a = 1", {"a": 1}, T),
        ("a * 1.5 > 0", {"a": 10**400}, U),  # too large for a float
        ("a * 2 > 0", {"a": 10**400}, T),
    ],
)
def test_arithmetic(text: str, env: dict[str, object], expected: bool | None) -> None:
    check([(text, env, expected)])


# ------------------------------------------------------------------------- BETWEEN


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("x BETWEEN 1 AND 3", {"x": 1}, T),
        ("x BETWEEN 1 AND 3", {"x": 3}, T),
        ("x BETWEEN 1 AND 3", {"x": 2.5}, T),
        ("x BETWEEN 1 AND 3", {"x": 0}, F),
        ("x BETWEEN 1 AND 3", {"x": 3.01}, F),
        ("x BETWEEN 1 AND 3", {}, U),
        ("x BETWEEN 1 AND 3", {"x": "2"}, U),
        ("x NOT BETWEEN 1 AND 3", {"x": 0}, T),
        ("x NOT BETWEEN 1 AND 3", {"x": 2}, F),
        ("x NOT BETWEEN 1 AND 3", {}, U),
        ("x NOT BETWEEN 1 AND 3", {"x": "2"}, U),
        ("x BETWEEN lo AND hi", {"x": 2, "lo": 1, "hi": 3}, T),
        ("x BETWEEN lo AND hi", {"x": 2, "lo": 1}, U),
        ("x BETWEEN lo AND hi", {"x": 9, "lo": 1}, U),
        ("x BETWEEN lo AND hi", {"x": 0, "hi": 3}, U),
        ("x BETWEEN lo AND hi", {"x": 9, "hi": 3}, F),  # FALSE AND UNKNOWN
        ("x NOT BETWEEN lo AND hi", {"x": 9, "hi": 3}, T),
        ("x BETWEEN 3 AND 1", {"x": 2}, F),
        ("x + 1 BETWEEN -1 AND 1", {"x": -1}, T),
    ],
)
def test_between(text: str, env: dict[str, object], expected: bool | None) -> None:
    check([(text, env, expected)])


# ------------------------------------------------------------------------------ IN


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("x IN ('a', 'b')", {"x": "a"}, T),
        ("x IN ('a', 'b')", {"x": "c"}, F),
        ("x IN ('a', 'b')", {}, U),
        ("x IN ('a')", {"x": "A"}, F),
        ("x NOT IN ('a', 'b')", {"x": "c"}, T),
        ("x NOT IN ('a', 'b')", {"x": "a"}, F),
        ("x NOT IN ('a', 'b')", {}, U),
        ("x IN (1, 2.5, -3)", {"x": 2.5}, T),
        ("x IN (1, 2.5, -3)", {"x": -3}, T),
        ("x IN (1, 2.5, -3)", {"x": 1.0}, T),
        ("x IN (1, 2.5, -3)", {"x": 4}, F),
        ("x IN (1, 2)", {"x": "1"}, U),  # x = 1 OR x = 2, both UNKNOWN
        ("x IN ('1', '2')", {"x": 1}, U),
        ("x IN ('a', 1)", {"x": "a"}, T),
        ("x IN ('a', 1)", {"x": 1}, T),
        ("x IN ('a', 1)", {"x": "b"}, U),  # 'b' = 1 is UNKNOWN
        ("x NOT IN ('a', 1)", {"x": "b"}, U),
        ("x IN ('true')", {"x": True}, U),
        ("x IN (1)", {"x": True}, U),
        ("x IN ('ab')", {"x": b"ab"}, F),
        ("x NOT IN ('ab')", {"x": uuid.UUID(int=1)}, T),
        ("x IN ('it''s', '%')", {"x": "it's"}, T),
        ("x IN ('%')", {"x": "anything"}, F),
    ],
)
def test_in(text: str, env: dict[str, object], expected: bool | None) -> None:
    check([(text, env, expected)])


# ---------------------------------------------------------------------------- LIKE


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("x LIKE 'abc'", "abc", T),
        ("x LIKE 'abc'", "abcd", F),  # anchored at the end
        ("x LIKE 'abc'", "xabc", F),  # and at the start
        ("x LIKE 'abc'", "ABC", F),  # case-sensitive
        ("x LIKE 'a%'", "a", T),
        ("x LIKE 'a%'", "abcdef", T),
        ("x LIKE 'a%'", "ba", F),
        ("x LIKE '%a'", "bba", T),
        ("x LIKE '%b%'", "abc", T),
        ("x LIKE '%b%'", "ac", F),
        ("x LIKE 'a_c'", "abc", T),
        ("x LIKE 'a_c'", "ac", F),
        ("x LIKE 'a_c'", "abbc", F),
        ("x LIKE '_'", "", F),
        ("x LIKE '%'", "", T),
        ("x LIKE ''", "", T),
        ("x LIKE 'a%b%c'", "aXbYbZc", T),
        ("x LIKE 'a%b%c'", "aXcYb", F),
        ("x LIKE '%a%a%'", "aa", T),
        ("x LIKE '%a%a%'", "a", F),
        ("x LIKE 'a.c'", "a.c", T),  # regex specials are literal
        ("x LIKE 'a.c'", "abc", F),
        ("x LIKE '(a)*[b]+?$^\\d|{2}'", "(a)*[b]+?$^\\d|{2}", T),
        ("x LIKE 'a_c'", "a\nc", T),  # _ and % match newlines too
        ("x LIKE 'a%'", "a\n\nb", T),
        ("x LIKE 'é_'", "éè", T),
        ("x LIKE '100!%' ESCAPE '!'", "100%", T),
        ("x LIKE '100!%' ESCAPE '!'", "1000", F),
        ("x LIKE 'a!_b' ESCAPE '!'", "a_b", T),
        ("x LIKE 'a!_b' ESCAPE '!'", "axb", F),
        ("x LIKE 'a!!b' ESCAPE '!'", "a!b", T),
        ("x LIKE 'a!xb' ESCAPE '!'", "axb", T),  # escaping an ordinary character
        ("x LIKE '\\%%' ESCAPE '\\'", "%abc", T),
        ("x LIKE '\\%%' ESCAPE '\\'", "abc", F),
        ("x LIKE '%''%'", "it's", T),
        ("x LIKE '%''%' ESCAPE ''''", "it's", F),  # '' escapes the following %
        ("x LIKE '%''%' ESCAPE ''''", "ab%", T),
        ("x LIKE '''%''%' ESCAPE ''''", "%%", T),
        ("x LIKE '''%''%' ESCAPE ''''", "%y%", F),
        ("x LIKE 'a%%b'", "ab", T),
        ("x NOT LIKE 'a%'", "ab", F),
        ("x NOT LIKE 'a%'", "ba", T),
    ],
)
def test_like(text: str, value: str, expected: bool | None) -> None:
    check([(text, {"x": value}, expected)])


def test_like_on_null_or_non_string_is_unknown() -> None:
    check(
        [
            ("x LIKE 'a%'", {}, U),
            ("x NOT LIKE 'a%'", {}, U),
            ("x LIKE '1'", {"x": 1}, U),
            ("x NOT LIKE '1'", {"x": 1}, U),
            ("x LIKE 'a'", {"x": b"a"}, U),
        ]
    )


def test_like_does_not_backtrack_exponentially() -> None:
    selector = compile_selector("x LIKE '" + "%a" * 30 + "%b'")
    value = "a" * 5000
    seconds = timeit.timeit(lambda: selector.matches({"x": value}.get), number=1)
    assert selector.matches({"x": value}.get) is False
    assert seconds < 0.5


# ------------------------------------------------------------------------- IS NULL


def test_is_null() -> None:
    check(
        [
            ("x IS NULL", {}, T),
            ("x IS NULL", {"x": 0}, F),
            ("x IS NULL", {"x": ""}, F),
            ("x IS NOT NULL", {"x": False}, T),
            ("x IS NOT NULL", {}, F),
            ("x + 1 IS NULL", {"x": "a"}, T),  # UNKNOWN arithmetic is NULL
            ("(x = 1) IS NULL", {}, T),
            ("NOT x IS NULL", {}, F),
        ]
    )


# -------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("text", "column", "fragment"),
    [
        ("color = ", 9, "expected a value at column 9, found end of input"),
        ("", 1, "empty selector: expected a condition at column 1, found end of input"),
        ("   ", 4, "empty selector"),
        ("a = 'red", 5, "unterminated string starting at column 5"),
        ("a = 'it''s", 5, "unterminated string"),
        ("a = 1 b", 7, "expected an operator or end of input at column 7, found identifier 'b'"),
        ("a = 1)", 6, "found ')'"),
        ("(a = 1", 7, "expected ')' at column 7, found end of input; the '(' at column 1"),
        ("a # 1", 3, "unexpected character at column 3, found '#'"),
        ("a != 1", 3, "write '<>' for not-equal"),
        ('a = "x"', 5, "strings take single quotes"),
        ("a = 12abc", 5, "invalid number at column 5, found '12abc'"),
        ("a = 1e", 5, "invalid number"),
        ("a = 0x", 5, "invalid number"),
        ("a = 0x1G", 5, "invalid number"),
        ("a = 1.2.3", 5, "invalid number"),
        ("a = 09", 5, "a leading 0 means octal"),
        ("a = " + "9" * 5000, 5, "number too long"),
        ("a LIKE 'x' ESCAPE 'ab'", 19, "expected a one-character string after ESCAPE"),
        ("a LIKE 'x' ESCAPE ''", 19, "one-character"),
        ("a LIKE 'x' ESCAPE 1", 19, "one-character"),
        ("a LIKE 'x!' ESCAPE '!'", 8, "LIKE pattern ends with its escape character '!'"),
        ("a LIKE b", 8, "expected a string literal pattern after LIKE"),
        ("a IN ()", 7, "expected a string or number literal in the IN list"),
        ("a IN (b)", 7, "found identifier 'b'"),
        ("a IN 'x'", 6, "expected '(' after IN"),
        ("a IN ('x' 'y')", 11, "expected ',' or ')'"),
        ("a IN (-'x')", 8, "expected a number after the sign"),
        ("a BETWEEN 1 OR 2", 13, "expected AND between the bounds of BETWEEN"),
        ("a IS 1", 6, "expected NULL or NOT NULL after IS"),
        ("a IS NOT 1", 10, "expected NULL after IS NOT"),
        ("a NOT = 1", 7, "expected BETWEEN, IN or LIKE after NOT"),
        ("a < b = c", 7, "comparisons do not chain"),
        ("a = NULL", 5, "test for NULL with 'x IS NULL'"),
        ("a = NOT b", 5, "expected a value"),
        ("a AND", 6, "expected a value"),
        ("3", 1, "expected a condition at column 1, found number 3"),
        ("'x'", 1, "expected a condition at column 1, found string 'x'"),
        ("a + 1", 1, "expected a condition at column 1, found an arithmetic expression"),
        ("a AND 3", 7, "expected a condition at column 7, found number 3"),
        ("NOT 'x'", 5, "expected a condition"),
        ("a = 1 OR -b", 10, "expected a condition"),
        ("'a' < 'b'", 1, "'<' compares numbers; strings and booleans take only = and <>"),
        ("a > TRUE", 5, "expected a numeric expression at column 5, found TRUE"),
        ("a + 'x' = 1", 5, "expected a numeric expression at column 5, found string 'x'"),
        ("-'x' = 1", 2, "expected a numeric expression"),
        ("-TRUE = a", 2, "found TRUE"),
        ("(a = 1) + 1 = 2", 2, "found a comparison"),
        ("a BETWEEN 'a' AND 'c'", 11, "BETWEEN compares numbers"),
        ("'x' BETWEEN 1 AND 2", 1, "BETWEEN compares numbers"),
        ("3 LIKE '3'", 1, "expected a string before LIKE"),
        ("TRUE IN ('a')", 1, "expected a string or number before IN"),
        ("(" * (MAX_NESTING + 1) + "a" + ")" * (MAX_NESTING + 1), MAX_NESTING + 1, "nested"),
        ("NOT " * (MAX_NESTING + 1) + "a", 4 * MAX_NESTING + 1, "nested"),
        ("a = " + "-" * (MAX_NESTING + 1) + "1", 5 + MAX_NESTING, "nested"),
    ],
)
def test_errors_name_problem_and_column(text: str, column: int, fragment: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    assert caught.value.position == column, str(caught.value)
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("selector " + repr(text[:100])[:-1])
    assert caught.value.selector == text


def test_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="expected a value"):
        compile_selector("a =")


def test_long_selector_is_shortened_in_the_message() -> None:
    text = "a = 1 AND " * 100 + "#"
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    assert caught.value.position == len(text)
    assert len(str(caught.value)) < 400


def test_non_string_selector_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="selector: expected a str, got bytes"):
        compile_selector(b"a = 1")  # type: ignore[arg-type]


def test_nesting_just_below_the_limit_compiles() -> None:
    depth = MAX_NESTING
    assert evaluate("(" * depth + "a = 1" + ")" * depth, a=1) is True
    assert evaluate("NOT " * (depth - 1) + "a = 1", a=1) is ((depth - 1) % 2 == 0)


def test_compiled_selectors_are_shared() -> None:
    assert compile_selector("a = 1") is compile_selector("a = 1")


def test_matches_is_fast() -> None:
    selector = compile_selector("color = 'red' AND weight > 2")
    lookup = {"color": "red", "weight": 3}.get
    assert selector.matches(lookup)
    n = 20_000
    best = min(timeit.repeat(lambda: selector.matches(lookup), number=n, repeat=3)) / n
    assert best < 10e-6  # about 0.3 µs here; the slack is for slow CI machines


# ============================================================ property-based tests
#
# Trees are tuples; `_render` writes them as selector text (only the parentheses that
# precedence needs, plus random extra ones) and `_ref` evaluates them directly, written
# from the JMS rules independently of the module.

_NAMES = ["a", "b", "Color", "weight", "properties.subject", "$x", "_y"]
_CHARS = "ab%_'!\\. \n"

# Precedence levels for rendering.
_OR_L, _AND_L, _NOT_L, _CMP_L, _ADD_L, _MUL_L, _UNARY_L, _PRIMARY_L = range(8)

_finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
_ident = st.sampled_from(_NAMES).map(lambda n: ("id", n))
_num_lit = st.one_of(st.integers(-20, 20), st.integers(-(2**70), 2**70), _finite).map(
    lambda v: ("lit", v)
)
_str_lit = st.text(alphabet=_CHARS, max_size=4).map(lambda v: ("lit", v))
_bool_lit = st.booleans().map(lambda v: ("lit", v))


@functools.cache
def _num(depth: int) -> st.SearchStrategy[tuple[Any, ...]]:
    leaves = st.one_of(_num_lit, _ident)
    if depth == 0:
        return leaves
    sub = _num(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(st.sampled_from(["neg", "pos"]), sub),
        st.tuples(st.just("arith"), st.sampled_from("+-*/"), sub, sub),
    )


def _like_pattern() -> st.SearchStrategy[tuple[str, str | None]]:
    def valid(pair: tuple[str, str | None]) -> bool:
        pattern, escape = pair
        return not (escape and _like_tokens(pattern, escape) is None)

    return st.tuples(st.text(alphabet="ab%_!", max_size=5), st.sampled_from([None, "!"])).filter(
        valid
    )


@functools.cache
def _cond(depth: int) -> st.SearchStrategy[tuple[Any, ...]]:
    num, text = _num(min(depth, 2)), st.one_of(_str_lit, _ident)
    value = st.one_of(num, text, _bool_lit)
    leaves = st.one_of(
        _ident,
        _bool_lit,
        st.tuples(st.just("cmp"), st.sampled_from(["=", "<>"]), value, value),
        st.tuples(st.just("cmp"), st.sampled_from(["<", "<=", ">", ">="]), num, num),
        st.tuples(st.just("between"), st.booleans(), num, num, num),
        st.tuples(
            st.just("in"),
            st.booleans(),
            st.one_of(num, text),
            st.lists(
                st.one_of(
                    st.text(alphabet=_CHARS, max_size=3), st.integers(-3, 3), st.sampled_from([0.5])
                ),
                min_size=1,
                max_size=4,
            ),
        ),
        st.tuples(st.just("like"), st.booleans(), text, _like_pattern()),
        st.tuples(st.just("isnull"), st.booleans(), value),
    )
    if depth == 0:
        return leaves
    sub = _cond(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(st.just("not"), sub),
        st.tuples(st.sampled_from(["and", "or"]), sub, sub),
        st.tuples(st.just("cmp"), st.sampled_from(["=", "<>"]), sub, sub),
    )


_values = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.5, 2.0, 0.0]),
    st.text(alphabet="ab%_", max_size=3),
    st.booleans(),
)
_envs = st.fixed_dictionaries({name: _values for name in _NAMES})


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _render_literal(v: object, rnd: random.Random) -> tuple[str, int]:
    if isinstance(v, bool):
        word = "TRUE" if v else "FALSE"
        return rnd.choice([word, word.lower(), word.title()]), _PRIMARY_L
    if isinstance(v, str):
        return _quote(v), _PRIMARY_L
    if isinstance(v, int):
        magnitude = abs(v)
        text = rnd.choice(
            [str(magnitude), hex(magnitude), f"{magnitude}L", "0" + format(magnitude, "o")]
        )  # the last is octal: a leading 0 means octal
        return (f"-{text}", _UNARY_L) if v < 0 else (text, _PRIMARY_L)
    assert isinstance(v, float)
    text = repr(abs(v))
    return (f"-{text}", _UNARY_L) if str(v).startswith("-") else (text, _PRIMARY_L)


def _render(node: tuple[Any, ...], rnd: random.Random) -> str:
    text, _ = _render_level(node, rnd)
    return text


def _render_level(node: tuple[Any, ...], rnd: random.Random) -> tuple[str, int]:
    def at(child: tuple[Any, ...], minimum: int) -> str:
        text, level = _render_level(child, rnd)
        if level < minimum or rnd.random() < 0.1:
            return f"({text})"
        return text

    def kw(word: str) -> str:
        return rnd.choice([word, word.lower()])

    tag = node[0]
    if tag == "lit":
        return _render_literal(node[1], rnd)
    if tag == "id":
        return node[1], _PRIMARY_L
    if tag in ("neg", "pos"):
        sign = "-" if tag == "neg" else "+"
        return f"{sign} {at(node[1], _UNARY_L)}", _UNARY_L
    if tag == "arith":
        _, op, a, b = node
        level = _ADD_L if op in "+-" else _MUL_L
        return f"{at(a, level)} {op} {at(b, level + 1)}", level
    if tag == "cmp":
        _, op, a, b = node
        return f"{at(a, _ADD_L)} {op} {at(b, _ADD_L)}", _CMP_L
    if tag == "between":
        _, neg, x, lo, hi = node
        word = f"{kw('NOT')} {kw('BETWEEN')}" if neg else kw("BETWEEN")
        text = f"{at(x, _ADD_L)} {word} {at(lo, _ADD_L)} {kw('AND')} {at(hi, _ADD_L)}"
        return text, _CMP_L
    if tag == "in":
        _, neg, x, items = node
        word = f"{kw('NOT')} {kw('IN')}" if neg else kw("IN")
        listed = ", ".join(_quote(i) if isinstance(i, str) else repr(i) for i in items)
        return f"{at(x, _ADD_L)} {word} ({listed})", _CMP_L
    if tag == "like":
        _, neg, x, (pattern, escape) = node
        word = f"{kw('NOT')} {kw('LIKE')}" if neg else kw("LIKE")
        text = f"{at(x, _ADD_L)} {word} {_quote(pattern)}"
        if escape is not None:
            text += f" {kw('ESCAPE')} {_quote(escape)}"
        return text, _CMP_L
    if tag == "isnull":
        _, neg, x = node
        return f"{at(x, _ADD_L)} {kw('IS')} {kw('NOT') + ' ' if neg else ''}{kw('NULL')}", _CMP_L
    if tag == "not":
        return f"{kw('NOT')} {at(node[1], _NOT_L)}", _NOT_L
    if tag in ("and", "or"):
        _, a, b = node
        level = _AND_L if tag == "and" else _OR_L
        return f"{at(a, level)} {kw(tag.upper())} {at(b, level + 1)}", level
    raise AssertionError(node)


# -- the reference interpreter


def _kind(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "num"
    return "str"


def _ref_eq(a: object, b: object) -> bool | None:
    if a is None or b is None or _kind(a) != _kind(b):
        return None
    return a == b


def _ref_not(v: bool | None) -> bool | None:
    return None if v is None else not v


def _ref_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _ref_or(a: bool | None, b: bool | None) -> bool | None:
    return _ref_not(_ref_and(_ref_not(a), _ref_not(b)))


def _ref_cond(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _ref(node: tuple[Any, ...], env: dict[str, object]) -> Any:
    tag = node[0]
    if tag == "lit":
        return node[1]
    if tag == "id":
        return env.get(node[1])
    if tag in ("neg", "pos"):
        v = _ref(node[1], env)
        if _kind(v) != "num":
            return None
        return -v if tag == "neg" else v
    if tag == "arith":
        _, op, a, b = node
        x, y = _ref(a, env), _ref(b, env)
        if _kind(x) != "num" or _kind(y) != "num":
            return None
        if op == "+":
            return x + y
        if op == "-":
            return x - y
        if op == "*":
            return x * y
        if y == 0:
            return None
        if isinstance(x, int) and isinstance(y, int):
            q = abs(x) // abs(y)
            return q if (x < 0) == (y < 0) else -q
        return x / y
    if tag == "cmp":
        _, op, a, b = node
        x, y = _ref(a, env), _ref(b, env)
        if op == "=":
            return _ref_eq(x, y)
        if op == "<>":
            return _ref_not(_ref_eq(x, y))
        if _kind(x) != "num" or _kind(y) != "num":
            return None
        return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]
    if tag == "between":
        _, neg, x, lo, hi = node
        lower = _ref(("cmp", "<=", lo, x), env)
        upper = _ref(("cmp", "<=", x, hi), env)
        r = _ref_and(lower, upper)
        return _ref_not(r) if neg else r
    if tag == "in":
        _, neg, x, items = node
        v = _ref(x, env)
        r: bool | None = False
        for item in items:
            r = _ref_or(r, _ref_eq(v, item))
        return _ref_not(r) if neg else r
    if tag == "like":
        _, neg, x, (pattern, escape) = node
        v = _ref(x, env)
        if not isinstance(v, str):
            return None
        r = _ref_like(v, pattern, escape)
        return _ref_not(r) if neg else r
    if tag == "isnull":
        _, neg, x = node
        return (_ref(x, env) is None) is not neg
    if tag == "not":
        return _ref_not(_ref_cond(_ref(node[1], env)))
    if tag == "and":
        return _ref_and(_ref_cond(_ref(node[1], env)), _ref_cond(_ref(node[2], env)))
    if tag == "or":
        return _ref_or(_ref_cond(_ref(node[1], env)), _ref_cond(_ref(node[2], env)))
    raise AssertionError(node)


def _like_tokens(pattern: str, escape: str | None) -> list[tuple[str, str]] | None:
    tokens = []
    chars = iter(pattern)
    for c in chars:
        if c == escape:
            nxt = next(chars, None)
            if nxt is None:
                return None
            tokens.append(("char", nxt))
        elif c == "%":
            tokens.append(("many", ""))
        elif c == "_":
            tokens.append(("one", ""))
        else:
            tokens.append(("char", c))
    return tokens


def _ref_like(s: str, pattern: str, escape: str | None) -> bool:
    tokens = _like_tokens(pattern, escape)
    assert tokens is not None

    @functools.cache
    def match(i: int, j: int) -> bool:
        if j == len(tokens):
            return i == len(s)
        kind, c = tokens[j]
        if kind == "many":
            return match(i, j + 1) or (i < len(s) and match(i + 1, j))
        if i == len(s):
            return False
        return (kind == "one" or s[i] == c) and match(i + 1, j + 1)

    return match(0, 0)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_cond(3), env=_envs, rnd=st.randoms(use_true_random=False))
def test_rendered_tree_evaluates_like_reference(
    tree: tuple[Any, ...], env: dict[str, object], rnd: random.Random
) -> None:
    text = _render(tree, rnd)
    selector = compile_selector(text)
    expected = _ref_cond(_ref(tree, env))
    assert selector.evaluate(env.get) is expected, text
    assert selector.matches(env.get) is (expected is True)


_SOUP = [
    "a", "b.c", "$d", "x1", "'x'", "''''", "'%_'", "'a", "1", "0x1F", "0x", "1.5", ".5", "1e3",
    "1e", "07", "09", "10L", "99999999999999999999", "TRUE", "false", "NULL", "NOT", "AND",
    "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "=", "<>", "<", "<=", ">", ">=", "+", "-",
    "*", "/", "(", ")", ",", "'", "!", "#", '"', "é", ".", "\t",
]  # fmt: skip
_odd_values = st.one_of(
    _values,
    st.sampled_from(
        [b"a", uuid.UUID(int=3), 10**400, float("inf"), float("nan"), -0.0, "", object()]
    ),
)


@st.composite
def _damaged_selectors(draw: st.DrawFn) -> str:
    """A valid selector, maybe with a random slice cut out: text near the grammar."""
    text = _render(draw(_cond(2)), draw(st.randoms(use_true_random=False)))
    if draw(st.booleans()):
        return text
    start = draw(st.integers(0, len(text)))
    return text[:start] + text[draw(st.integers(start, len(text))) :]


@settings(max_examples=600, deadline=None)
@given(
    text=st.one_of(
        st.lists(st.sampled_from(_SOUP), max_size=14).flatmap(
            lambda parts: st.sampled_from([" ", ""]).map(lambda sep: sep.join(parts))
        ),
        st.text(max_size=30),
        _damaged_selectors(),
    ),
    values=st.lists(_odd_values, min_size=1, max_size=4),
)
def test_random_text_raises_only_selector_error(text: str, values: list[object]) -> None:
    try:
        selector = compile_selector(text)
    except SelectorError as e:
        assert 1 <= e.position <= len(text) + 1
        return
    assert isinstance(selector, Selector)

    def lookup(name: str) -> object:
        return values[len(name) % len(values)]

    assert selector.matches(lookup) in (True, False)
    assert selector.evaluate(lookup) in (True, False, None)


@settings(max_examples=500, deadline=None)
@given(
    pattern=st.text(alphabet="ab%_!.*\n", max_size=8),
    escape=st.sampled_from([None, "!", "%", "a"]),
    value=st.text(alphabet="ab%_!.*\n", max_size=10),
)
def test_like_agrees_with_reference_matcher(pattern: str, escape: str | None, value: str) -> None:
    text = f"x LIKE {_quote(pattern)}"
    if escape is not None:
        text += f" ESCAPE {_quote(escape)}"
    if _like_tokens(pattern, escape) is None:
        with pytest.raises(SelectorError, match="ends with its escape character"):
            compile_selector(text)
        return
    expected = _ref_like(value, pattern, escape)
    assert compile_selector(text).evaluate({"x": value}.get) is expected
    assert compile_selector(f"NOT {text}").evaluate({"x": value}.get) is (not expected)
