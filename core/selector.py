"""JMS message selectors (the SQL92 subset of JMS 2.0, section 3.8.1), compiled once.

Used for AMQP's `apache.org:selector-filter:string` source filter and for Artemis-style
queue filters. `compile_selector(text)` parses and type-checks a selector and returns a
`Selector`; `Selector.matches(lookup)` evaluates it against one message, where
`lookup(identifier)` returns the identifier's value, or None when the message has none.

Giving identifiers a meaning is the caller's job. Callers typically map (as the Qpid JMS
client and Artemis do for AMQP 1.0):

- `JMSMessageID`: properties.message-id, as the string `ID:...`
- `JMSCorrelationID`: properties.correlation-id
- `JMSPriority`: header.priority (0 to 9; 4 when absent)
- `JMSDeliveryMode`: header.durable, as `'PERSISTENT'` or `'NON_PERSISTENT'`
- `JMSTimestamp`: properties.creation-time; `JMSExpiration`: properties.absolute-expiry-time
  (both milliseconds since the epoch)
- `JMSType`: properties.subject
- `JMSReplyTo`, `JMSDestination`: properties.reply-to, properties.to
- `JMSXUserID`, `JMSXGroupID`, `JMSXGroupSeq`: properties.user-id, group-id, group-sequence
- `JMSXDeliveryCount`: header.delivery-count + 1
- dotted names such as `properties.subject` or `header.priority`, where a caller wants them
- anything else: the application property of that name

Language (keywords are case-insensitive, everything else is case-sensitive):

- literals: `'text'` (`''` is a quote), `42`, `42L`, `0x2A`, `052` (a leading 0 means
  octal, as in Artemis), `1.5`, `.5`, `1e3`, `TRUE`, `FALSE`
- identifiers: a Java identifier (letters, digits, `$`, `_`) that may also contain `.`
- `OR` < `AND` < `NOT` < comparisons < `+ -` < `* /` < unary `+ -`, and parentheses
- `= <> < <= > >=`, `x [NOT] BETWEEN a AND b`, `x [NOT] IN ('a', 'b', 3)`,
  `x [NOT] LIKE 'pat%_' [ESCAPE '!']`, `x IS [NOT] NULL`

Semantics follow the JMS three-valued logic: a missing identifier is NULL, NULL makes
comparisons and arithmetic UNKNOWN, `AND`/`OR`/`NOT` use the SQL truth tables, and a
message matches only when the selector is TRUE. Comparing values of different types (a
string with a number, a boolean with a string) is UNKNOWN, not an error; integers and
floats compare numerically; `< <= > >=`, `BETWEEN` and arithmetic take numbers only;
integer division truncates toward zero as in Java; division by zero is UNKNOWN. Values of
other types (bytes, uuid.UUID, ...) support only `=` and `<>`, by Python equality.

Mistakes that no message could make TRUE, such as `'a' < 'b'`, `- 'x'` or `color AND 3`,
are rejected when compiling rather than silently never matching.
"""

from __future__ import annotations

import functools
import operator
import re
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, NamedTuple

__all__ = [
    "Lookup",
    "Selector",
    "SelectorError",
    "SelectorFilter",
    "compile_selector",
    "is_property_name",
    "value_key",
]

#: Resolves an identifier to its value in one message, or None when it has none.
Lookup = Callable[[str], object]

# A compiled node: evaluates to a value, or for conditions to True/False/None (UNKNOWN).
_Eval = Callable[[Lookup], object]

#: How deeply parentheses, NOT and unary signs may nest. It keeps the recursive parser and
#: the nested closures far from Python's recursion limit; real selectors stay in single
#: digits.
MAX_NESTING: Final = 50

_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE"}
)
_COMPARISONS: Final = frozenset({"=", "<>", "<", "<=", ">", ">="})
_ORDERINGS: Final = frozenset({"<", "<=", ">", ">="})
_DIGITS: Final = frozenset("0123456789")
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")
# Java's isJavaIdentifierStart / isJavaIdentifierPart, by Unicode category.
_START_CATEGORIES: Final = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})
_PART_CATEGORIES: Final = _START_CATEGORIES | {"Nd", "Mn", "Mc", "Cf"}
_SHOWN_TEXT: Final = 200


class SelectorError(ValueError):
    """A selector that does not parse or type-check.

    `position` is the 1-based column of the offending character or token; `selector`
    is the whole text.
    """

    def __init__(self, message: str, *, selector: str, position: int) -> None:
        super().__init__(message)
        self.selector = selector
        self.position = position


def _error(
    text: str, index: int, problem: str, found: str | None = None, hint: str | None = None
) -> SelectorError:
    shown = text if len(text) <= _SHOWN_TEXT else text[:_SHOWN_TEXT] + "..."
    message = f"selector {shown!r}: {problem} at column {index + 1}"
    if found is not None:
        message += f", found {found}"
    if hint is not None:
        message += f"; {hint}"
    return SelectorError(message, selector=text, position=index + 1)


# ----------------------------------------------------------------------------- tokens


class _Token(NamedTuple):
    kind: str  # "str", "num", "id", "kw", "op" or "eof"
    value: object  # the literal's value, the upper-cased keyword, the operator, the name
    pos: int  # 0-based index into the selector text
    text: str  # as written

    def describe(self) -> str:
        text = self.text if len(self.text) <= 40 else self.text[:40] + "..."
        if self.kind == "eof":
            return "end of input"
        if self.kind == "str":
            return f"string {text}"
        if self.kind == "num":
            return f"number {text}"
        if self.kind == "id":
            return f"identifier {text!r}"
        if self.kind == "kw":
            return f"keyword {self.value}"
        return repr(text)


def _is_ident_start(c: str) -> bool:
    if c.isascii():
        return c.isalpha() or c in "$_"
    return unicodedata.category(c) in _START_CATEGORIES


def _is_ident_part(c: str) -> bool:
    if c.isascii():
        return c.isalnum() or c in "$_."
    return unicodedata.category(c) in _PART_CATEGORIES


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    n = len(text)
    i = 0
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            tokens.append(_Token("eof", None, n, ""))
            return tokens
        c = text[i]
        if c == "'":
            i = _scan_string(text, i, tokens)
        elif c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            i = _scan_number(text, i, tokens)
        elif _is_ident_start(c):
            j = i + 1
            while j < n and _is_ident_part(text[j]):
                j += 1
            word = text[i:j]
            # Only ASCII words can be keywords: '\u0131n'.upper() == 'IN', yet it is an identifier.
            upper = word.upper()
            if word.isascii() and upper in _KEYWORDS:
                tokens.append(_Token("kw", upper, i, word))
            else:
                tokens.append(_Token("id", word, i, word))
            i = j
        elif text[i : i + 2] in ("<>", "<=", ">="):
            tokens.append(_Token("op", text[i : i + 2], i, text[i : i + 2]))
            i += 2
        elif c in "=<>+-*/(),":
            tokens.append(_Token("op", c, i, c))
            i += 1
        else:
            hint = None
            if text[i : i + 2] == "!=":
                hint = "write '<>' for not-equal"
            elif c == '"':
                hint = "strings take single quotes"
            raise _error(
                text,
                i,
                "unexpected character",
                repr(c),
                hint or "expected an identifier, a literal, an operator or a parenthesis",
            )


def _scan_string(text: str, start: int, tokens: list[_Token]) -> int:
    parts = []
    j = start + 1
    while True:
        k = text.find("'", j)
        if k < 0:
            raise _error(
                text,
                start,
                "unterminated string starting",
                hint="expected a closing ' (write '' for a quote inside a string)",
            )
        parts.append(text[j:k])
        if text.startswith("'", k + 1):
            parts.append("'")
            j = k + 2
            continue
        end = k + 1
        tokens.append(_Token("str", "".join(parts), start, text[start:end]))
        return end


def _scan_number(text: str, start: int, tokens: list[_Token]) -> int:
    n = len(text)
    value: int | float
    if text.startswith(("0x", "0X"), start):
        j = start + 2
        while j < n and text[j] in _HEX_DIGITS:
            j += 1
        digits = text[start + 2 : j]
        if j < n and text[j] in "lL":
            j += 1
        value = int(digits, 16) if digits else 0
        valid = bool(digits)
    else:
        j = start
        while j < n and text[j] in _DIGITS:
            j += 1
        is_float = False
        if j < n and text[j] == ".":
            is_float = True
            j += 1
            while j < n and text[j] in _DIGITS:
                j += 1
        if j < n and text[j] in "eE":
            k = j + 1
            if k < n and text[k] in "+-":
                k += 1
            if k < n and text[k] in _DIGITS:
                is_float = True
                j = k
                while j < n and text[j] in _DIGITS:
                    j += 1
            # otherwise the 'e' is left over and reported as part of an invalid number
        digits = text[start:j]
        valid = True
        if is_float:
            value = float(digits)
        else:
            if j < n and text[j] in "lL":
                j += 1
            if len(digits) > 1 and digits[0] == "0":
                valid = all(d in "01234567" for d in digits)
                value = int(digits, 8) if valid else 0
            else:
                try:
                    value = int(digits)
                except ValueError:  # longer than sys.get_int_max_str_digits()
                    raise _error(
                        text,
                        start,
                        "number too long",
                        f"{len(digits)} digits",
                        "expected at most a few thousand digits",
                    ) from None
    end = j
    if end < n and _is_ident_part(text[end]):
        valid = False
        while end < n and _is_ident_part(text[end]):
            end += 1
    if not valid:
        raise _error(
            text,
            start,
            "invalid number",
            repr(text[start:end]),
            "expected digits with an optional L suffix, a hex 0x1F, an octal 017 "
            "(a leading 0 means octal) or a decimal such as 1.5, .5 or 1e3",
        )
    tokens.append(_Token("num", value, start, text[start:j]))
    return j


# ------------------------------------------------------------------------ syntax tree

# Static kinds: what a node can evaluate to, apart from NULL. An identifier can be anything.
_BOOL, _NUM, _STR, _ANY = "boolean", "numeric", "string", "any"


class _Node:
    __slots__ = ("desc", "kind", "pos")

    def __init__(self, kind: str, pos: int, desc: str) -> None:
        self.kind = kind
        self.pos = pos
        self.desc = desc  # for "found ..." in type errors


class _Lit(_Node):
    __slots__ = ("value",)

    def __init__(self, value: object, kind: str, pos: int, desc: str) -> None:
        super().__init__(kind, pos, desc)
        self.value = value


class _Ident(_Node):
    __slots__ = ("name",)

    def __init__(self, name: str, pos: int) -> None:
        super().__init__(_ANY, pos, f"identifier {name!r}")
        self.name = name


class _Sign(_Node):
    __slots__ = ("negate", "operand")

    def __init__(self, negate: bool, operand: _Node, pos: int) -> None:
        super().__init__(_NUM, pos, "an arithmetic expression")
        self.negate = negate
        self.operand = operand


class _Arith(_Node):
    """`first op1 x1 op2 x2 ...`, one precedence level, evaluated left to right."""

    __slots__ = ("first", "rest")

    def __init__(self, first: _Node, rest: list[tuple[str, _Node]]) -> None:
        super().__init__(_NUM, first.pos, "an arithmetic expression")
        self.first = first
        self.rest = rest


class _Compare(_Node):
    __slots__ = ("left", "op", "right")

    def __init__(self, op: str, left: _Node, right: _Node) -> None:
        super().__init__(_BOOL, left.pos, "a comparison")
        self.op = op
        self.left = left
        self.right = right


class _Between(_Node):
    __slots__ = ("high", "low", "negated", "operand")

    def __init__(self, operand: _Node, low: _Node, high: _Node, negated: bool) -> None:
        super().__init__(_BOOL, operand.pos, "a BETWEEN condition")
        self.operand = operand
        self.low = low
        self.high = high
        self.negated = negated


class _In(_Node):
    __slots__ = ("items", "negated", "operand")

    def __init__(self, operand: _Node, items: list[str | int | float], negated: bool) -> None:
        super().__init__(_BOOL, operand.pos, "an IN condition")
        self.operand = operand
        self.items = items
        self.negated = negated


class _Like(_Node):
    __slots__ = ("negated", "operand", "regex")

    def __init__(self, operand: _Node, regex: re.Pattern[str], negated: bool) -> None:
        super().__init__(_BOOL, operand.pos, "a LIKE condition")
        self.operand = operand
        self.regex = regex
        self.negated = negated


class _IsNull(_Node):
    __slots__ = ("negated", "operand")

    def __init__(self, operand: _Node, negated: bool) -> None:
        super().__init__(_BOOL, operand.pos, "an IS NULL condition")
        self.operand = operand
        self.negated = negated


class _Not(_Node):
    __slots__ = ("operand",)

    def __init__(self, operand: _Node, pos: int) -> None:
        super().__init__(_BOOL, pos, "a NOT condition")
        self.operand = operand


class _Logic(_Node):
    """`AND` or `OR` over two or more conditions (flattened so long chains stay shallow)."""

    __slots__ = ("is_and", "operands")

    def __init__(self, is_and: bool, operands: list[_Node]) -> None:
        super().__init__(
            _BOOL, operands[0].pos, "an AND condition" if is_and else "an OR condition"
        )
        self.is_and = is_and
        self.operands = operands


# ---------------------------------------------------------------------------- parsing


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.depth = 0
        self.identifiers: set[str] = set()

    # -- helpers

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "eof":
            self.i += 1
        return token

    def at_kw(self, *words: str) -> bool:
        token = self.tokens[self.i]
        return token.kind == "kw" and token.value in words

    def at_op(self, *ops: str) -> bool:
        token = self.tokens[self.i]
        return token.kind == "op" and token.value in ops

    def fail(
        self, problem: str, token: _Token | None = None, hint: str | None = None
    ) -> SelectorError:
        token = token or self.peek()
        return _error(self.text, token.pos, problem, token.describe(), hint)

    @contextmanager
    def nested(self, token: _Token) -> Iterator[None]:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _error(
                self.text,
                token.pos,
                f"expressions nested more than {MAX_NESTING} deep",
                hint="expected fewer parentheses, NOTs or signs inside each other",
            )
        try:
            yield
        finally:
            self.depth -= 1

    def need(
        self, node: _Node, kinds: tuple[str, ...], expected: str, hint: str | None = None
    ) -> None:
        if node.kind not in kinds:
            raise _error(self.text, node.pos, f"expected {expected}", node.desc, hint)

    def need_condition(self, node: _Node) -> None:
        self.need(node, (_BOOL, _ANY), "a condition")

    def need_number(self, node: _Node, hint: str | None = None) -> None:
        self.need(node, (_NUM, _ANY), "a numeric expression", hint)

    # -- grammar, lowest precedence first

    def parse(self) -> _Node:
        if self.peek().kind == "eof":
            raise self.fail(
                "empty selector: expected a condition",
                hint="to select every message, attach no selector",
            )
        node = self.parse_or()
        if self.peek().kind != "eof":
            raise self.fail("expected an operator or end of input")
        self.need_condition(node)
        return node

    def parse_or(self) -> _Node:
        operands = [self.parse_and()]
        while self.at_kw("OR"):
            self.take()
            operands.append(self.parse_and())
        if len(operands) == 1:
            return operands[0]
        for operand in operands:
            self.need_condition(operand)
        return _Logic(False, operands)

    def parse_and(self) -> _Node:
        operands = [self.parse_not()]
        while self.at_kw("AND"):
            self.take()
            operands.append(self.parse_not())
        if len(operands) == 1:
            return operands[0]
        for operand in operands:
            self.need_condition(operand)
        return _Logic(True, operands)

    def parse_not(self) -> _Node:
        if not self.at_kw("NOT"):
            return self.parse_comparison()
        token = self.take()
        with self.nested(token):
            operand = self.parse_not()
        self.need_condition(operand)
        return _Not(operand, token.pos)

    def parse_comparison(self) -> _Node:
        left = self.parse_additive()
        token = self.peek()
        node: _Node
        if token.kind == "op" and token.value in _COMPARISONS:
            op = str(self.take().value)
            right = self.parse_additive()
            if op in _ORDERINGS:
                hint = f"'{op}' compares numbers; strings and booleans take only = and <>"
                self.need_number(left, hint)
                self.need_number(right, hint)
            node = _Compare(op, left, right)
        elif self.at_kw("NOT"):
            self.take()
            if not self.at_kw("BETWEEN", "IN", "LIKE"):
                raise self.fail("expected BETWEEN, IN or LIKE after NOT")
            node = self.parse_predicate(left, negated=True)
        elif self.at_kw("BETWEEN", "IN", "LIKE"):
            node = self.parse_predicate(left, negated=False)
        elif self.at_kw("IS"):
            self.take()
            negated = self.at_kw("NOT")
            if negated:
                self.take()
            if not self.at_kw("NULL"):
                raise self.fail(
                    "expected NULL after IS NOT"
                    if negated
                    else "expected NULL or NOT NULL after IS"
                )
            self.take()
            node = _IsNull(left, negated)
        else:
            return left
        after = self.peek()
        if (after.kind == "op" and after.value in _COMPARISONS) or self.at_kw(
            "BETWEEN", "IN", "LIKE", "IS"
        ):
            raise self.fail(
                "expected AND, OR, ')' or end of input",
                hint="comparisons do not chain; add parentheses",
            )
        return node

    def parse_predicate(self, operand: _Node, negated: bool) -> _Node:
        keyword = self.take().value
        if keyword == "BETWEEN":
            low = self.parse_additive()
            if not self.at_kw("AND"):
                raise self.fail("expected AND between the bounds of BETWEEN")
            self.take()
            high = self.parse_additive()
            hint = "BETWEEN compares numbers"
            for node in (operand, low, high):
                self.need_number(node, hint)
            return _Between(operand, low, high, negated)
        if keyword == "IN":
            self.need(operand, (_STR, _NUM, _ANY), "a string or number before IN")
            if not self.at_op("("):
                raise self.fail("expected '(' after IN")
            self.take()
            items = [self.parse_in_item()]
            while self.at_op(","):
                self.take()
                items.append(self.parse_in_item())
            if not self.at_op(")"):
                raise self.fail("expected ',' or ')' in the IN list")
            self.take()
            return _In(operand, items, negated)
        # LIKE
        self.need(operand, (_STR, _ANY), "a string before LIKE")
        pattern = self.take()
        if pattern.kind != "str":
            raise self.fail("expected a string literal pattern after LIKE", pattern)
        escape = None
        if self.at_kw("ESCAPE"):
            self.take()
            token = self.take()
            if token.kind != "str" or len(str(token.value)) != 1:
                raise self.fail("expected a one-character string after ESCAPE", token)
            escape = str(token.value)
        regex = _like_regex(str(pattern.value), escape)
        if regex is None:
            raise _error(
                self.text,
                pattern.pos,
                f"LIKE pattern ends with its escape character {escape!r}",
                hint="expected a character after the escape character",
            )
        return _Like(operand, regex, negated)

    def parse_in_item(self) -> str | int | float:
        token = self.take()
        negate = False
        if token.kind == "op" and token.value in ("+", "-"):
            negate = token.value == "-"
            token = self.take()
            if token.kind != "num":
                raise self.fail("expected a number after the sign in the IN list", token)
        if token.kind == "str":
            return str(token.value)
        if token.kind == "num":
            value = token.value
            assert isinstance(value, int | float)
            return -value if negate else value
        raise self.fail("expected a string or number literal in the IN list", token)

    def parse_additive(self) -> _Node:
        return self.parse_arithmetic(("+", "-"), self.parse_multiplicative)

    def parse_multiplicative(self) -> _Node:
        return self.parse_arithmetic(("*", "/"), self.parse_unary)

    def parse_arithmetic(self, ops: tuple[str, ...], operand: Callable[[], _Node]) -> _Node:
        first = operand()
        rest: list[tuple[str, _Node]] = []
        while self.at_op(*ops):
            op = str(self.take().value)
            rest.append((op, operand()))
        if not rest:
            return first
        self.need_number(first)
        for _, node in rest:
            self.need_number(node)
        return _Arith(first, rest)

    def parse_unary(self) -> _Node:
        if not self.at_op("+", "-"):
            return self.parse_primary()
        token = self.take()
        with self.nested(token):
            operand = self.parse_unary()
        self.need_number(operand)
        negate = token.value == "-"
        if isinstance(operand, _Lit):
            # Folded so that `x > -5` compares against a literal (the fast path).
            value = operand.value
            assert isinstance(value, int | float)
            shown = f"number {token.text}{operand.desc.removeprefix('number ')}"
            return _Lit(-value if negate else value, _NUM, token.pos, shown)
        return _Sign(negate, operand, token.pos)

    def parse_primary(self) -> _Node:
        token = self.peek()
        if token.kind == "op" and token.value == "(":
            self.take()
            with self.nested(token):
                node = self.parse_or()
            if not self.at_op(")"):
                raise self.fail(
                    "expected ')'", hint=f"the '(' at column {token.pos + 1} is not closed"
                )
            self.take()
            return node
        if token.kind == "str":
            self.take()
            return _Lit(token.value, _STR, token.pos, token.describe())
        if token.kind == "num":
            self.take()
            return _Lit(token.value, _NUM, token.pos, token.describe())
        if token.kind == "kw" and token.value in ("TRUE", "FALSE"):
            self.take()
            return _Lit(token.value == "TRUE", _BOOL, token.pos, str(token.value))
        if token.kind == "id":
            self.take()
            name = str(token.value)
            self.identifiers.add(name)
            return _Ident(name, token.pos)
        if token.kind == "kw" and token.value == "NULL":
            raise self.fail("expected a value", hint="test for NULL with 'x IS NULL'")
        raise self.fail("expected a value")


def _like_regex(pattern: str, escape: str | None) -> re.Pattern[str] | None:
    """The anchored regex (use fullmatch) for a LIKE pattern; None if it ends in `escape`.

    The pattern is cut at each `%` into fixed-width segments. Every segment but the last is
    matched at its leftmost occurrence inside an atomic group: that is always a correct
    choice for fixed-width segments, and it stops `'%a%a%a%b'` from backtracking through
    every way of splitting a long string of a's.
    """
    segments: list[list[str]] = [[]]
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            i += 1
            if i == len(pattern):
                return None
            segments[-1].append(re.escape(pattern[i]))
        elif c == "%":
            segments.append([])
        elif c == "_":
            segments[-1].append(".")
        else:
            segments[-1].append(re.escape(c))
        i += 1
    parts = ["".join(segment) for segment in segments]
    if len(parts) == 1:
        source = parts[0]
    else:
        middle = "".join(f"(?>.*?{part})" for part in parts[1:-1] if part)
        source = f"{parts[0]}{middle}.*{parts[-1]}"
    return re.compile(source, re.DOTALL)


# ------------------------------------------------------------------ value semantics


def _is_number(v: object) -> bool:
    t = type(v)
    if t is int or t is float:
        return True
    return isinstance(v, int | float) and not isinstance(v, bool)


def _kind_of(v: object) -> str:
    if isinstance(v, bool):
        return _BOOL
    if isinstance(v, int | float):
        return _NUM
    if isinstance(v, str):
        return _STR
    return _ANY  # some other type: compared by equality only


def _equal(a: object, b: object) -> bool | None:
    t = type(a)
    if t is type(b) and (t is str or t is int or t is float or t is bool):
        return a == b
    if a is None or b is None:
        return None
    ka = _kind_of(a)
    kb = _kind_of(b)
    if ka == kb or ka is _ANY or kb is _ANY:
        try:
            return bool(a == b)
        except Exception:  # an exotic type whose == raises or returns an array
            return None
    return None


def _not_equal(a: object, b: object) -> bool | None:
    r = _equal(a, b)
    return None if r is None else not r


def _ordering(op: Callable[[Any, Any], object]) -> Callable[[object, object], bool | None]:
    def compare(a: object, b: object) -> bool | None:
        if _is_number(a) and _is_number(b):
            return bool(op(a, b))
        return None

    return compare


_COMPARE: Final[dict[str, Callable[[object, object], bool | None]]] = {
    "=": _equal,
    "<>": _not_equal,
    "<": _ordering(operator.lt),
    "<=": _ordering(operator.le),
    ">": _ordering(operator.gt),
    ">=": _ordering(operator.ge),
}
_MIRRORED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _arithmetic(op: str) -> Callable[[object, object], object]:
    binary: Callable[[object, object], object] = {
        "+": operator.add,
        "-": operator.sub,
        "*": operator.mul,
    }.get(op, operator.truediv)

    def apply(a: object, b: object) -> object:
        if not (_is_number(a) and _is_number(b)):
            return None
        if op == "/":
            if b == 0:
                return None
            if isinstance(a, int) and isinstance(b, int):
                # Java's long division truncates toward zero; Python's // floors.
                q = a // b
                if q < 0 and q * b != a:
                    q += 1
                return q
        try:
            return binary(a, b)
        except OverflowError:  # an int too large to become a float
            return None

    return apply


_ARITHMETIC: Final = {op: _arithmetic(op) for op in "+-*/"}


# -------------------------------------------------------------------------- compiling


def _compile(node: _Node) -> _Eval:
    """A closure computing `node`'s value (True/False/None for conditions)."""
    if isinstance(node, _Lit):
        constant = node.value
        return lambda lookup: constant
    if isinstance(node, _Ident):
        name = node.name
        return lambda lookup: lookup(name)
    if isinstance(node, _Sign):
        return _compile_sign(node)
    if isinstance(node, _Arith):
        return _compile_arith(node)
    if isinstance(node, _Compare):
        return _compile_compare(node)
    if isinstance(node, _Between):
        return _compile_between(node)
    if isinstance(node, _In):
        return _negated(_compile_in(node), node.negated)
    if isinstance(node, _Like):
        return _compile_like(node)
    if isinstance(node, _IsNull):
        return _compile_is_null(node)
    if isinstance(node, _Not):
        return _negated(_compile_condition(node.operand), True)
    if isinstance(node, _Logic):
        return _compile_logic(node)
    raise AssertionError(f"selector: no compiler for {type(node).__name__}")


def _compile_condition(node: _Node) -> _Eval:
    """Like `_compile`, but an identifier's value counts only when it is a boolean."""
    evaluate = _compile(node)
    if node.kind == _BOOL:
        return evaluate

    def as_condition(lookup: Lookup) -> object:
        v = evaluate(lookup)
        return v if v is True or v is False else None

    return as_condition


def _negated(evaluate: _Eval, negate: bool) -> _Eval:
    if not negate:
        return evaluate

    def negated(lookup: Lookup) -> object:
        r = evaluate(lookup)
        return None if r is None else not r

    return negated


def _compile_sign(node: _Sign) -> _Eval:
    operand = _compile(node.operand)
    if node.negate:

        def negative(lookup: Lookup) -> object:
            v = operand(lookup)
            return -v if _is_number(v) else None  # type: ignore[operator]

        return negative

    def positive(lookup: Lookup) -> object:
        v = operand(lookup)
        return v if _is_number(v) else None

    return positive


def _compile_arith(node: _Arith) -> _Eval:
    first = _compile(node.first)
    if len(node.rest) == 1:
        op, right_node = node.rest[0]
        apply = _ARITHMETIC[op]
        right = _compile(right_node)
        return lambda lookup: apply(first(lookup), right(lookup))
    steps = [(_ARITHMETIC[op], _compile(operand)) for op, operand in node.rest]

    def chain(lookup: Lookup) -> object:
        v = first(lookup)
        for apply, operand in steps:
            v = apply(v, operand(lookup))
        return v

    return chain


def _compile_compare(node: _Compare) -> _Eval:
    op, left, right = node.op, node.left, node.right
    if isinstance(left, _Lit) and isinstance(right, _Ident):
        left, right, op = right, left, _MIRRORED[op]
    if isinstance(left, _Ident) and isinstance(right, _Lit):
        return _compile_compare_literal(op, left.name, right.value)
    compare = _COMPARE[op]
    lhs, rhs = _compile(left), _compile(right)
    return lambda lookup: compare(lhs(lookup), rhs(lookup))


def _compile_compare_literal(op: str, name: str, constant: object) -> _Eval:
    """`identifier op literal`, the common case, with the usual types tested first."""
    compare = _COMPARE[op]
    if op in _ORDERINGS:  # the literal is a number (checked when parsing)
        native: Callable[[Any, Any], bool] = {
            "<": operator.lt,
            "<=": operator.le,
            ">": operator.gt,
            ">=": operator.ge,
        }[op]

        def ordered(lookup: Lookup) -> object:
            v = lookup(name)
            t = type(v)
            if t is int or t is float:
                return native(v, constant)
            return compare(v, constant)

        return ordered
    plain = type(constant)  # str, int, float or bool
    if op == "=":

        def equal(lookup: Lookup) -> object:
            v = lookup(name)
            if type(v) is plain:
                return v == constant
            return _equal(v, constant)

        return equal

    def not_equal(lookup: Lookup) -> object:
        v = lookup(name)
        if type(v) is plain:
            return v != constant
        return _not_equal(v, constant)

    return not_equal


def _compile_between(node: _Between) -> _Eval:
    negated = node.negated
    low, high = node.low, node.high
    if isinstance(node.operand, _Ident) and isinstance(low, _Lit) and isinstance(high, _Lit):
        name, lo, hi = node.operand.name, low.value, high.value

        def between_literals(lookup: Lookup) -> object:
            v = lookup(name)
            if not _is_number(v):
                return None
            return (lo <= v <= hi) is not negated  # type: ignore[operator]

        return between_literals
    operand, lower, upper = _compile(node.operand), _compile(low), _compile(high)
    at_most = _COMPARE["<="]

    def between(lookup: Lookup) -> object:
        v = operand(lookup)
        above = at_most(lower(lookup), v)
        below = at_most(v, upper(lookup))
        if above is False or below is False:
            r: bool | None = False
        elif above is None or below is None:
            r = None
        else:
            r = True
        return r if r is None else r is not negated

    return between


def _compile_in(node: _In) -> _Eval:
    # `x IN (a, b)` is `x = a OR x = b`: a string is UNKNOWN against a number item, so a
    # string that is in no string item is FALSE only when every item is a string.
    operand = _compile(node.operand)
    items = tuple(node.items)
    strings = frozenset(i for i in items if isinstance(i, str))
    numbers = frozenset(i for i in items if not isinstance(i, str))

    def in_list(lookup: Lookup) -> object:
        v = operand(lookup)
        if v is None or isinstance(v, bool):
            return None
        if isinstance(v, str):
            return True if v in strings else (None if numbers else False)
        if _is_number(v):
            return True if v in numbers else (None if strings else False)
        unknown = False
        for item in items:
            r = _equal(v, item)
            if r:
                return True
            unknown = unknown or r is None
        return None if unknown else False

    return in_list


def _compile_like(node: _Like) -> _Eval:
    operand = _compile(node.operand)
    fullmatch = node.regex.fullmatch
    negated = node.negated

    def like(lookup: Lookup) -> object:
        v = operand(lookup)
        if isinstance(v, str):
            return (fullmatch(v) is None) is negated
        return None

    return like


def _compile_is_null(node: _IsNull) -> _Eval:
    operand = _compile(node.operand)
    if node.negated:
        return lambda lookup: operand(lookup) is not None
    return lambda lookup: operand(lookup) is None


def _compile_logic(node: _Logic) -> _Eval:
    operands = [_compile_condition(operand) for operand in node.operands]
    # The value that decides the result on its own: FALSE for AND, TRUE for OR.
    decisive = not node.is_and
    if len(operands) == 2:
        first, second = operands

        def pair(lookup: Lookup) -> object:
            a = first(lookup)
            if a is decisive:
                return a
            b = second(lookup)
            if b is decisive:
                return b
            return None if a is None or b is None else a

        return pair

    def chain(lookup: Lookup) -> object:
        unknown = False
        for operand in operands:
            r = operand(lookup)
            if r is decisive:
                return r
            if r is None:
                unknown = True
        return None if unknown else not decisive

    return chain


# ---------------------------------------------------------------- what a match requires
#
# Page summaries (the paging plugin) record, per property name, the values a page's
# messages hold; a selector that can only be TRUE when some property holds one of a few
# values lets a reader skip a page whose summary has none of them. Both sides meet on
# `value_key`: two values a selector's `=` finds equal always have the same key.

#: What `Selector.requires` maps each identifier to: the keys one of which its value must have.
Requirements = dict[str, frozenset[bytes]]


def is_property_name(identifier: str) -> bool:
    """True when callers resolve `identifier` to the application property of that name
    (the convention above: not a `JMS...` name, no dotted prefix)."""
    return "." not in identifier and not identifier.startswith("JMS")


def value_key(value: object) -> bytes | None:
    """A stable key for `value` such that values a selector's `=` finds equal share it
    (`1` and `1.0`, a str and a str subclass); None for a value that no key can stand
    for (a type compared by Python equality, or NaN), which callers must treat as "any".

    Stable across processes (no `hash()`), so keys can be stored.
    """
    if isinstance(value, bool):
        return b"b1" if value else b"b0"
    if isinstance(value, int):
        return b"n" + str(int(value)).encode()
    if isinstance(value, float):
        number = float(value)
        if number != number:
            return None  # NaN equals nothing; "any" is the safe answer
        if number.is_integer():
            return b"n" + str(int(number)).encode()
        return b"n" + repr(number).encode()
    if isinstance(value, str):
        return b"s" + str(value).encode("utf-8", "surrogatepass")
    return None


def _requirements(node: _Node) -> Requirements:
    """Identifier -> the keys one of which its value must have for `node` to be TRUE;
    empty when nothing so simple is required (LIKE, ranges, NOT, OR of other names...)."""
    if isinstance(node, _Compare) and node.op == "=":
        left, right = node.left, node.right
        if isinstance(left, _Lit):
            left, right = right, left
        if isinstance(left, _Ident) and isinstance(right, _Lit):
            key = value_key(right.value)
            if key is not None:
                return {left.name: frozenset((key,))}
        return {}
    if isinstance(node, _In) and not node.negated and isinstance(node.operand, _Ident):
        item_keys = [value_key(item) for item in node.items]
        if None in item_keys:
            return {}
        return {node.operand.name: frozenset(k for k in item_keys if k is not None)}
    if isinstance(node, _Logic):
        parts = [_requirements(operand) for operand in node.operands]
        merged: Requirements = {}
        if node.is_and:  # every operand's requirements hold together
            for part in parts:
                for name, keys in part.items():
                    merged[name] = merged[name] & keys if name in merged else keys
            return merged
        # OR: only a name every operand constrains, to any of their values
        for name in set.intersection(*(set(part) for part in parts)):
            merged[name] = frozenset().union(*(part[name] for part in parts))
        return merged
    return {}


# ----------------------------------------------------------------------------- public


class Selector:
    """A compiled selector; build one with `compile_selector`."""

    __slots__ = ("_evaluate", "identifiers", "properties_only", "requires", "text")

    def __init__(
        self,
        text: str,
        evaluate: _Eval,
        identifiers: frozenset[str],
        requires: Requirements | None = None,
    ) -> None:
        self.text = text
        #: The identifiers the selector reads, for callers that resolve them up front.
        self.identifiers = identifiers
        #: Whether every identifier is an application property's name (`is_property_name`):
        #: the selector can run on a format's `properties` of a message's bytes.
        self.properties_only = all(is_property_name(name) for name in identifiers)
        #: What any message it matches must hold: identifier -> `value_key`s, one of which
        #: the identifier's value has. Empty when it cannot say (LIKE, ranges, OR of
        #: unrelated conditions...); an empty key set means nothing can match.
        self.requires: Requirements = requires or {}
        self._evaluate = evaluate

    def matches(self, lookup: Lookup) -> bool:
        """True when the selector is TRUE for the message `lookup` reads (not FALSE or UNKNOWN)."""
        return self._evaluate(lookup) is True

    def evaluate(self, lookup: Lookup) -> bool | None:
        """The three-valued result: True, False, or None for UNKNOWN."""
        r = self._evaluate(lookup)
        return r if r is True or r is False else None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


class SelectorFilter:
    """A selector as a message filter (a consumer's or a queue's `filter`).

    Called with a message; `selector` stays reachable for readers that evaluate it
    without building a message (paged records: `selector.matches` over their bytes).
    A selector that reads application properties only runs on its message format's
    `properties` of the message's bytes, which a format may share between messages whose
    encoded properties are the same (the AMQP format does): the verdict on the last
    mapping is kept, so a scan of one producer's messages mostly reads a slice of each.
    """

    __slots__ = ("_evaluate", "_last", "selector")

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        self._evaluate = selector._evaluate
        #: (properties, verdict) of the last message read by properties; one tuple, so
        #: that a page reader's thread calling it too reads a consistent pair.
        self._last: tuple[object, bool] = (None, False)

    def __call__(self, message: Any) -> bool:
        try:
            if not self.selector.properties_only:
                return self._evaluate(message.lookup()) is True
            properties = message.kind.format.properties(message.data)
        except ValueError:  # properties that cannot be read (a malformed message): no match
            return False
        last = self._last
        if last[0] is properties:
            return last[1]
        try:
            verdict = self._evaluate(properties.get) is True
        except ValueError:
            return False
        self._last = (properties, verdict)
        return verdict

    def __repr__(self) -> str:
        return f"SelectorFilter({self.selector.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and type-check `text`; raises `SelectorError` naming the column at fault.

    An empty or blank selector is an error: "no filter" is for the caller to express.
    Results are cached, since many consumers tend to share a few selectors.
    """
    if not isinstance(text, str):
        raise TypeError(f"selector: expected a str, got {type(text).__name__} {text!r}")
    return _compile_cached(text)


@functools.lru_cache(maxsize=256)
def _compile_cached(text: str) -> Selector:
    parser = _Parser(text)
    tree = parser.parse()
    return Selector(
        text, _compile_condition(tree), frozenset(parser.identifiers), _requirements(tree)
    )
